#include "meshtrain/data/mixture.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace meshtrain {

void check_sources(const std::vector<MixtureSource>& sources) {
  if (sources.empty()) throw std::invalid_argument("data.sources is empty: give at least one {name, path, weight}");
  std::set<std::string> names;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    const std::string where = fmt::format("data.sources[{}]{}", i, s.name.empty() ? "" : " (" + s.name + ")");
    if (s.name.empty()) throw std::invalid_argument(fmt::format("{}: give it a name (it names its metrics)", where));
    if (!names.insert(s.name).second) {
      throw std::invalid_argument(fmt::format("{}: the name \"{}\" is used twice; names must differ", where, s.name));
    }
    if (s.shards.empty()) throw std::invalid_argument(fmt::format("{}: no path (its token shards)", where));
    if (!std::isfinite(s.weight) || s.weight <= 0) {
      throw std::invalid_argument(fmt::format("{}: weight {} must be a positive finite number (weights are relative: "
                                              "0.7 and 0.3, or 7 and 3; drop a source rather than weigh it 0)",
                                              where, s.weight));
    }
  }
}

SourceBlend::SourceBlend(const std::vector<double>& weights) : w_(weights), taken_(weights.size(), 0) {
  double sum = 0;
  for (double w : w_) sum += w;
  for (double& w : w_) w /= sum;
}

size_t SourceBlend::next() {
  // Megatron-LM's build_blending_indices: the largest error w_i max(j, 1) - taken_i.
  const double j = std::max(static_cast<double>(slots_), 1.0);
  size_t best = 0;
  double best_error = -INFINITY;
  for (size_t i = 0; i < w_.size(); ++i) {
    const double error = w_[i] * j - static_cast<double>(taken_[i]);
    if (error > best_error) best = i, best_error = error;
  }
  taken_[best] += 1;
  slots_ += 1;
  return best;
}

void SourceBlend::reset() {
  std::fill(taken_.begin(), taken_.end(), 0);
  slots_ = 0;
}

}  // namespace meshtrain
