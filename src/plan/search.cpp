#include "meshtrain/plan/search.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain::plan {
namespace {

std::vector<int> divisors(int n, int limit) {
  std::vector<int> d;
  for (int i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

template <typename T>
std::vector<T> choices(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

Strategy base_strategy(const SearchInput& in) {
  Strategy s;
  s.seq = in.seq;
  s.global_batch = in.global_batch;
  s.precision = in.precision;
  return s;
}

void explain(const SearchInput& in, SearchResult& r) {
  auto& out = r.explanation;
  const double mem = in.gpu.memory_bytes;
  // The plain data-parallel baseline: every GPU holds the whole model.
  Strategy base = base_strategy(in);
  base.dp = in.gpus;
  std::optional<MemoryPlan> plain;
  try {
    if (in.global_batch % in.gpus == 0) plain = memory_ledger(in.model, base, in.memory);
  } catch (const std::invalid_argument&) {
  }
  if (r.ranked.empty()) {
    if (r.leanest) {
      out.push_back(fmt::format(
          "Nothing fits: the leanest valid plan ({}) needs {} per GPU, more than the {} of a {}. Add GPUs, "
          "use GPUs with more memory, offload optimizer states, or shorten the sequence.",
          r.leanest->strategy.describe(), human_bytes(r.leanest->peak_bytes), human_bytes(mem), in.gpu.name));
    } else {
      out.push_back("Nothing is valid: no (tp, pp, cp, dp) divides the model and the GPU count as asked.");
    }
    return;
  }
  const Candidate& best = r.ranked.front();
  const Strategy& s = best.strategy;
  if (plain) {
    const StageLedger& p = plain->peak();
    const double states = p.line("parameters").bytes + p.line("gradients").bytes + p.line("optimizer states").bytes;
    const double acts = p.line("activations").bytes;
    if (p.device_total() <= mem) {
      out.push_back(fmt::format("Fits as plain data parallelism ({} of {} per GPU).", human_bytes(p.device_total()),
                                human_bytes(mem)));
    } else {
      out.push_back(fmt::format("1. Does it fit? Plain DP needs {} per GPU (model states {}, activations {}) > {}.",
                                human_bytes(p.device_total()), human_bytes(states), human_bytes(acts),
                                human_bytes(mem)));
    }
  }
  const StageLedger& b = best.memory.peak();
  if (s.zero > 0) {
    out.push_back(fmt::format("   Redundant state -> ZeRO-{}: parameters + gradients + optimizer now {} per GPU.",
                              s.zero,
                              human_bytes(b.line("parameters").bytes + b.line("gradients").bytes +
                                          b.line("optimizer states").bytes)));
  }
  if (s.tp > 1) {
    out.push_back(fmt::format("   A layer too big -> TP={}{}: each layer's weights and activations split {} ways, "
                              "inside one node ({} GPUs per node).",
                              s.tp, s.sp ? " + SP" : "", s.tp, in.gpu.per_node));
  }
  if (s.pp > 1) {
    out.push_back(fmt::format("   Too many layers -> PP={}{}: {} layers per stage; bubble {:.1f}% of the step.", s.pp,
                              s.vpp > 1 ? fmt::format(" (interleaved, v={})", s.vpp) : "",
                              in.model.layers / s.pp, 100 * best.estimate.bubble_fraction));
  }
  if (s.cp > 1) {
    out.push_back(fmt::format("   Sequence too long -> CP={}: {} tokens per rank.", s.cp, (s.seq ? s.seq : in.model.seq) / s.cp));
  }
  if (s.recompute != Recompute::None || s.microbatches() > 1) {
    out.push_back(fmt::format("   Activations -> {} recomputation, micro-batch {} with {} accumulation steps: "
                              "activations {} per GPU.",
                              to_string(s.recompute), s.micro_batch, s.microbatches(),
                              human_bytes(b.line("activations").bytes)));
  }
  out.push_back(fmt::format("2. Fast enough? -> DP={} replicas; estimated {:.3f} s per step, {:.0f} tokens/s, MFU "
                            "{:.1f}%.",
                            s.dp, best.estimate.step_s, best.estimate.tokens_per_s, 100 * best.estimate.mfu));
  out.push_back("Mesh order, most frequent traffic on the fastest link: " + mesh_order(s, in.gpu.per_node));
}

}  // namespace

std::string mesh_order(const Strategy& s, int per_node) {
  std::string out;
  const std::pair<const char*, int> order[] = {{"tp", s.tp}, {"cp", s.cp}, {"ep", s.ep}, {"dp", s.dp}, {"pp", s.pp}};
  for (const auto& [name, size] : order) {
    if (size == 1) continue;
    if (!out.empty()) out += " -> ";
    out += fmt::format("{}={} [{}]", name, size,
                       axis_crosses_nodes(s, name, per_node) ? "across nodes" : "inside a node");
  }
  return out.empty() ? "one GPU" : out;
}

SearchResult search(const SearchInput& in) {
  validate(in.model);
  if (in.gpus < 1) throw std::invalid_argument(fmt::format("--gpus {} must be at least 1", in.gpus));
  if (in.global_batch < 1) throw std::invalid_argument(fmt::format("--global-batch {} must be at least 1", in.global_batch));
  if (in.seq < 0) throw std::invalid_argument(fmt::format("--seq {} must be positive", in.seq));
  const Fixed& f = in.fixed;
  const int fixed_product = f.tp.value_or(1) * f.pp.value_or(1) * f.cp.value_or(1) * f.ep.value_or(1) * f.dp.value_or(1);
  if (in.gpus % fixed_product != 0) {
    throw std::invalid_argument(fmt::format("--gpus {} is not divisible by the fixed sizes' product {}", in.gpus,
                                            fixed_product));
  }
  SearchResult r;
  const int per_node = in.gpu.per_node;
  std::vector<int> eps = in.model.moe() ? divisors(static_cast<int>(in.model.experts), in.gpus) : std::vector<int>{1};
  for (int tp : choices(f.tp, divisors(in.gpus, per_node)))
    for (int cp : choices(f.cp, std::vector<int>{1, 2, 4, 8, 16}))
      for (int ep : choices(f.ep, eps))
        for (int pp : choices(f.pp, divisors(in.gpus, static_cast<int>(in.model.layers)))) {
          if (in.gpus % (tp * cp * ep * pp) != 0) continue;
          const int dp = in.gpus / (tp * cp * ep * pp);
          if (f.dp && *f.dp != dp) continue;
          for (int vpp : choices(f.vpp, std::vector<int>{1, 2}))
            for (int zero : choices(f.zero, std::vector<int>{0, 1, 2, 3}))
              for (Recompute rc : choices(f.recompute, {Recompute::None, Recompute::Selective, Recompute::Full}))
                for (int64_t mb : choices(f.micro_batch, std::vector<int64_t>{1, 2, 4, 8})) {
                  Strategy s = base_strategy(in);
                  s.tp = tp, s.cp = cp, s.ep = ep, s.dp = dp, s.pp = pp, s.vpp = vpp;
                  s.sp = tp > 1;
                  s.zero = zero;
                  s.recompute = rc;
                  s.micro_batch = mb;
                  s.schedule = vpp > 1 ? Schedule::Interleaved : Schedule::OneFOneB;
                  if (vpp > 1 && pp == 1) continue;
                  try {
                    validate(s, in.model);
                  } catch (const std::invalid_argument&) {
                    continue;
                  }
                  ++r.considered;
                  Candidate c;
                  c.strategy = s;
                  c.memory = memory_ledger(in.model, s, in.memory);
                  c.peak_bytes = c.memory.peak().device_total();
                  c.estimate = estimate_step(in.model, s, in.gpu, in.estimate);
                  if (!r.leanest || c.peak_bytes < r.leanest->peak_bytes) r.leanest = c;
                  if (c.peak_bytes <= in.gpu.memory_bytes) r.ranked.push_back(std::move(c));
                }
        }
  r.feasible = static_cast<int>(r.ranked.size());
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    return a.estimate.step_s < b.estimate.step_s;
  });
  explain(in, r);
  return r;
}

}  // namespace meshtrain::plan
