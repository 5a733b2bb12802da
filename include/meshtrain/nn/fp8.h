// FP8 linears (Micikevicius et al., "FP8 Formats for Deep Learning", arXiv 2209.05433):
// weights and activations in e4m3 (largest finite 448), gradients in e5m2 (57344),
// each tensor with one scale (per-tensor scaling):
//
//   scale = fp8_max / max(amax, 1e-12) / 2^margin      q = cast(clamp(x * scale, ±fp8_max))
//   y = x Wᵀ ≈ (q_x q_Wᵀ) / (scale_x scale_W)           accumulated in fp32
//   dx = dy W,  dW = dyᵀ x                               dy in e5m2, x and W as forward saved them
//
// The clamp is the saturation: a value beyond fp8_max becomes ±fp8_max (the cast
// alone would make it NaN in e4m3). The GEMMs are at::_scaled_mm on both devices:
// Hopper's FP8 tensor cores on CUDA, oneDNN on CPU (which runs the same recipe in
// emulation, for the numerics: not for speed). Operands are laid out as CUDA's
// kernel requires (first row-major, second column-major).
//
// Scaling (the amax each scale comes from):
// - Current (torchao float8 "tensorwise", torchtitan's default): the tensor's own
//   amax, at the call.
// - Delayed (Transformer Engine's DelayedScaling): the max over a history of the
//   last H optimizer steps' amaxes. The scales are fixed for the whole step (so a
//   recomputed forward quantises exactly as the first one did); each call records
//   its amax, and Fp8Linear::push (once per step) rolls the step's amax into the
//   history and derives the next scales. A state with no history yet (the first
//   step of a run) scales as Current and records (torchao's delayed scaling does the same).
//
// Invariant (the same numbers on every mesh): an amax is the max over the whole
// tensor the single-process run would see. Every call-time amax is MAX-reduced over
// the `shared` groups, the ranks that split one product of this linear (tp: the
// weight and the row-parallel input are split along features, the column-parallel
// output gradient along outputs; cp: activations along the sequence). A max over a
// replicated value is that value, so all three are reduced over all groups. The
// step's recorded amaxes are reduced by the caller over the data replicas as well
// (train/fp8_training.h): a micro-batch on another data-parallel rank is one the
// single process would have run in the same step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain {
class Comm;
}

namespace meshtrain::nn {

enum class Fp8Format { E4M3, E5M2 };
double fp8_max(Fp8Format f);  // 448 | 57344
c10::ScalarType fp8_dtype(Fp8Format f);

enum class Fp8Scaling { Current, Delayed };
// "current" | "delayed"; std::invalid_argument naming the value otherwise.
Fp8Scaling parse_fp8_scaling(const std::string& s);
const char* to_string(Fp8Scaling s);

struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::Current;
  int64_t history = 16;  // delayed: steps of amax kept (torchao's default; Transformer Engine's is 1024)
  int64_t margin = 0;    // scales divided by 2^margin (headroom; Transformer Engine's `margin`)
};

// The scale of the formula above, from an amax (0-dim fp32 tensors).
at::Tensor fp8_scale(const at::Tensor& amax, Fp8Format f, int64_t margin);
// x * scale, saturated to ±fp8_max, cast to the format.
at::Tensor fp8_quantize(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);

// One linear's scaling state: its input, weight and output gradient (rows 0, 1, 2).
class Fp8Linear {
 public:
  enum Role : int64_t { kInput = 0, kWeight = 1, kGrad = 2 };
  // `shared`: the groups whose ranks split one product of this linear (see above);
  // groups of one rank are skipped. `device`: where its tensors live.
  Fp8Linear(Fp8Recipe r, std::vector<Comm*> shared, c10::Device device);

  // y = x Wᵀ [..., in] x [out, in] -> [..., out] through FP8, differentiable in x and W
  // (W's gradient only when W requires it). Output dtype: autocast's on this device
  // when it is on, else x's. Records amaxes under GradMode only (evaluation does not).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w);

  // The scale to quantise `t` (the role's tensor) with; with `record`, its amax counts
  // towards the step's (delayed scaling).
  at::Tensor scale(Role role, const at::Tensor& t, bool record);
  void note_weight_copy(int64_t bytes) { copy_bytes_ = bytes; }

  const Fp8Recipe& recipe() const { return recipe_; }
  // Delayed: this step's recorded amaxes [3] (local: the caller reduces them).
  const at::Tensor& step_amax() const { return step_amax_; }
  // Delayed: rolls `amax` [3] (the step's, reduced) into the history and derives the scales.
  void push(const at::Tensor& amax);
  // [3, history], newest first; zeros before the first push.
  const at::Tensor& history() const { return history_; }
  bool has_history() const { return pushed_; }
  // Bytes of the e4m3 weight copy the last forward made (what one micro-batch's backward keeps).
  int64_t weight_copy_bytes() const { return copy_bytes_; }
  // From a checkpoint: the history as push() left it (scales derived again).
  void restore(const at::Tensor& history);

 private:
  at::Tensor reduced_amax(const at::Tensor& t);
  void derive_scales();  // from the history; clears the step's amaxes
  Fp8Recipe recipe_;
  std::vector<Comm*> shared_;
  at::Tensor history_, scales_, step_amax_;  // [3, H], [3], [3] fp32
  bool pushed_ = false;
  int64_t copy_bytes_ = 0;
};

}  // namespace meshtrain::nn
