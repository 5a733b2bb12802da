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

#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain::nn {

class WeightGradStash {
 public:
  void add(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& dy);
  // Adds every recorded dyᵀ x to its weight's .grad, in recording order, and clears.
  void run();
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::tuple<at::Tensor, at::Tensor, at::Tensor>> items_;  // weight, x [n, in], dy [n, out]
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

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace meshtrain::nn
