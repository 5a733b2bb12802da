#include "meshtrain/plan/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "meshtrain/plan/count.h"

namespace meshtrain::plan {

Balance parse_balance(const std::string& s) {
  if (s == "parameters") return Balance::Parameters;
  if (s == "compute") return Balance::Compute;
  throw std::invalid_argument(fmt::format("'{}' is not a stage balance: use \"parameters\" (every stage's parameter "
                                          "count: memory) or \"compute\" (matmul work per token: the head counted, "
                                          "the embedding lookup free)",
                                          s));
}

const char* balance_name(Balance b) { return b == Balance::Compute ? "compute" : "parameters"; }

std::vector<StageRange> partition_layers(const ModelSpec& m, int stages, const std::vector<int64_t>& per_stage,
                                         Balance balance) {
  const int64_t L = m.layers;
  if (stages < 1) throw std::invalid_argument(fmt::format("pipeline stages {} must be at least 1", stages));
  if (L < stages) {
    throw std::invalid_argument(fmt::format("model '{}' has {} layers, too few for {} pipeline stages (pp x virtual); "
                                            "every stage needs at least one layer",
                                            m.name, L, stages));
  }
  const ParamCount c = count_params(m);
  // prefix[i]: parameters of layers [0, i) (MoE and dense layers differ).
  std::vector<int64_t> prefix(static_cast<size_t>(L) + 1, 0);
  for (int64_t i = 0; i < L; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + c.of(m, i).total();
  auto span = [&](int64_t first, int64_t n) { return prefix[static_cast<size_t>(first + n)] - prefix[static_cast<size_t>(first)]; };
  const int64_t first_extra = c.embedding + c.positions;
  const int64_t last_extra = c.final_norm + (m.tied ? c.embedding : c.head);
  auto stage_params = [&](int s, int64_t first, int64_t layers) {
    return span(first, layers) + (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
  };
  // Matmul work per token in units of one multiply-add per weight: a layer's
  // weights, the head's V x h; the embedding lookup and positions are free.
  const int64_t head_cost = m.tied ? c.embedding : c.head;
  auto stage_work = [&](int s, int64_t first, int64_t layers) {
    return span(first, layers) + (s == stages - 1 ? head_cost : 0);
  };
  auto stage_cost = [&](int s, int64_t first, int64_t layers) {
    return balance == Balance::Parameters ? stage_params(s, first, layers) : stage_work(s, first, layers);
  };
  std::vector<int64_t> counts(per_stage);
  if (counts.empty()) {
    // Minimise the largest stage: dp[s][l] = best max over stages 0..s-1 holding l layers.
    constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(L + 1, kInf));
    std::vector<std::vector<int64_t>> take(stages + 1, std::vector<int64_t>(L + 1, 0));
    best[0][0] = 0;
    for (int s = 1; s <= stages; ++s) {
      for (int64_t l = s; l <= L - (stages - s); ++l) {
        for (int64_t k = 1; k <= l - (s - 1); ++k) {
          if (best[s - 1][l - k] == kInf) continue;
          const int64_t v = std::max(best[s - 1][l - k], stage_cost(s - 1, l - k, k));
          // Ties: prefer the later stages lighter (fewer layers last), deterministic.
          if (v < best[s][l]) {
            best[s][l] = v;
            take[s][l] = k;
          }
        }
      }
    }
    counts.assign(stages, 0);
    for (int s = stages, l = static_cast<int>(L); s > 0; --s) {
      counts[s - 1] = take[s][l];
      l -= static_cast<int>(take[s][l]);
    }
  } else {
    if (static_cast<int>(counts.size()) != stages) {
      throw std::invalid_argument(fmt::format("layers per stage lists {} stages, the pipeline has {} (pp x virtual)",
                                              counts.size(), stages));
    }
    const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (sum != L || *std::min_element(counts.begin(), counts.end()) < 1) {
      throw std::invalid_argument(fmt::format("layers per stage [{}] must be >= 1 each and add up to the model's {} "
                                              "layers (they add up to {})",
                                              fmt::join(counts, ", "), L, sum));
    }
  }
  std::vector<StageRange> out;
  int64_t at = 0;
  for (int s = 0; s < stages; ++s) {
    out.push_back({at, at + counts[s], stage_params(s, at, counts[s]), stage_work(s, at, counts[s])});
    at += counts[s];
  }
  return out;
}

}  // namespace meshtrain::plan
