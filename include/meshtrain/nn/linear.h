// y = x Wᵀ (+ b), with the weight gradient optionally split off for
// zero-bubble pipeline schedules (Qi et al., arXiv 2401.10241 sec. 2): the
// backward "B" then computes the input and bias gradients only and records
// (x, dy) in a WeightGradStash; the "W" pass later adds dyᵀ x to W's .grad.
//
// Invariants:
// - A linear records only if it ran forward inside DeferWeightGrads and its
//   backward runs while a stash is the target (WeightGradTarget); otherwise the
//   weight gradient is computed at once, as by at::linear. Either way the sum
//   of everything added to W's .grad is the same gradient.
// - The W pass accumulates into an existing .grad in place (views stay views:
//   ZeRO-1's flat gradient buffers).
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain::nn {

class WeightGradStash {
 public:
  void add(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& dy);
  // A weight gradient already computed (the fused cross-entropy's dW), added as it is.
  void add_ready(const at::Tensor& weight, const at::Tensor& grad);
  // A weight gradient computed by `grad` in the W pass (nn/fp8.h's dyᵀ x in FP8).
  void add_deferred(const at::Tensor& weight, std::function<at::Tensor()> grad);
  // Adds every recorded dyᵀ x to its weight's .grad, in recording order, and clears.
  void run();
  bool empty() const { return items_.empty(); }

 private:
  // The weight and how its gradient is computed when run() comes.
  struct Item {
    at::Tensor weight;
    std::function<at::Tensor()> grad;
  };
  std::vector<Item> items_;
};

// While alive (on this thread), linear() builds nodes whose weight gradient can be deferred.
class DeferWeightGrads {
 public:
  DeferWeightGrads();
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  bool was_;
};

// While alive (on this thread), deferred nodes' backward records into `stash`.
class WeightGradTarget {
 public:
  explicit WeightGradTarget(WeightGradStash* stash);
  ~WeightGradTarget();
  WeightGradTarget(const WeightGradTarget&) = delete;
  WeightGradTarget& operator=(const WeightGradTarget&) = delete;

 private:
  WeightGradStash* was_;
};

// For other operations with a weight gradient (parallel/tensor/fused_cross_entropy.h):
// whether a node built now may defer its weight gradient (inside DeferWeightGrads),
// and the stash a backward running now records into (nullptr: none).
bool weight_grads_deferrable();
WeightGradStash* weight_grad_target();

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace meshtrain::nn
