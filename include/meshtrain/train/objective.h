// What a training method supplies to the step (train/step.h): its loss on a
// micro-batch, the units that loss is a mean over, and the metrics it logs.
//
// Invariant (with step.h's): the step divides every micro-batch's summed loss
// by the units of the whole global batch (counted once, over every
// micro-batch and data-parallel rank), so the accumulated gradient is that of
// the global mean whatever the split. Units are target tokens for next-token
// methods (pretraining, SFT: the loader has already masked the targets not
// trained) and pairs for DPO (dpo/dpo.h).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/data/loader.h"

namespace meshtrain {

class Transformer;

class Objective {
 public:
  virtual ~Objective() = default;
  // What the loss is a mean over in `b` (this rank's micro-batch).
  virtual double units(const Batch& b) const = 0;
  // The micro-batch's loss summed over its units: differentiable through `m`
  // when `train` (dropout on), else computed as for evaluation. Adds each
  // metric's sum over the units to `metric_sums` (sized like metrics()).
  virtual at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) = 0;
  // Names of the metrics logged beside the loss (each a mean over the units).
  virtual std::vector<std::string> metrics() const { return {}; }
};

// Pretraining and SFT: −log p(target) per target token (targets < 0 ignored),
// with the batch's document mask when it has one.
class NextTokenObjective : public Objective {
 public:
  double units(const Batch& b) const override;
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override;
};

}  // namespace meshtrain
