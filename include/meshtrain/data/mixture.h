// Data mixtures: several sources (a name, its token shards, a weight), blended
// window by window (data/loader.h's TokenLoader takes them).
//
// Which source fills the global slot j (slots are the windows of the steps in
// order, each step's dp_size x micro_batch of them, rank r taking the r-th
// micro_batch) is Megatron-LM's blending rule (megatron/core/datasets/
// helpers.cpp, build_blending_indices): the source whose share lags most,
//   argmax_i  w_i max(j, 1) - taken_i(j)   (w normalised to sum 1; ties: the first),
// so after any n slots every source has had w_i n windows to within one: the
// proportions hold at every prefix, not only on average. Each source then
// gives its own windows in its own shuffled order (TokenLoader's, from the
// seed and the source's index), a new epoch of that source when it runs out;
// sources epoch independently, and an over-sampled one shows it in its epochs.
// The position is the slot count alone: the per-source counts follow from
// replaying the rule, so a restored state resumes every source exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct MixtureSource {
  std::string name;
  std::vector<std::string> shards;
  double weight = 1;
  std::vector<std::string> val;  // its validation shards (optional): a validation loss per source
};

// Throws std::invalid_argument naming the source and the fix: no sources, an
// empty or repeated name, no shards, a weight that is not a positive finite number.
void check_sources(const std::vector<MixtureSource>& sources);

// The blending rule, one slot at a time.
class SourceBlend {
 public:
  explicit SourceBlend(const std::vector<double>& weights);  // weights checked by check_sources
  // The source of the next slot (and counts it).
  size_t next();
  uint64_t slots() const { return slots_; }
  const std::vector<uint64_t>& taken() const { return taken_; }
  void reset();

 private:
  std::vector<double> w_;  // normalised
  std::vector<uint64_t> taken_;
  uint64_t slots_ = 0;
};

}  // namespace meshtrain
