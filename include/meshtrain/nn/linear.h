// y = x Wᵀ (+ b), with the weight gradient optionally split off for
// zero-bubble pipeline schedules (Qi et al., arXiv 2401.10241 sec. 2): the
// backward "B" then computes the input and bias gradients only and records
// (x, dy) in a WeightGradStash; the "W" pass later adds dyᵀ x to W's .grad.
//
// Otherwise (fp32, no autocast) the weight gradient's accumulation is fused
// into its GEMM, as Megatron-LM's gradient_accumulation_fusion does: where W's
// .grad already exists (DDP's and ZeRO-1/2's bucket views, a later micro-batch),
// the backward adds dyᵀ x into it with beta = 1 and hands AccumulateGrad no
// gradient, instead of a temporary dW that AccumulateGrad adds in a second pass.
//
// Invariants:
// - A linear records only if it ran forward inside DeferWeightGrads and its
//   backward runs while a stash is the target (WeightGradTarget); otherwise the
//   weight gradient is computed at once, as by at::linear. Either way the sum
//   of everything added to W's .grad is the same gradient.
// - The W pass accumulates into an existing .grad in place (views stay views:
//   ZeRO-1's flat gradient buffers).
// - The fused accumulation writes .grad only where AccumulateGrad would have
//   added into it in place: a leaf W whose .grad is a dense tensor of W's shape
//   and dtype, in a backward that runs every AccumulateGrad (not autograd::grad
//   or backward(inputs=...)), without create_graph, with no hook on W's
//   gradient (tensor or post-accumulate hooks see nothing). AccumulateGrad still
//   runs (with no gradient) after this node, so hooks on the accumulator node
//   itself (DDP's and ZeRO's gradient-ready hooks) fire once .grad is final.
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
// Whether a backward running now may add a gradient of `dtype` into weight's existing .grad
// itself (the invariants above); it then hands AccumulateGrad no gradient for weight.
bool grad_accumulates_in_place(const at::Tensor& weight, at::ScalarType dtype);

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace meshtrain::nn
