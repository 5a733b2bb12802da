#include "meshtrain/nn/fp8.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "meshtrain/compat.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// torchao's EPS: an all-zero tensor gets a large finite scale (its quantisation is zeros either way).
constexpr double kAmaxFloor = 1e-12;

// `t` stored column-major (same shape): CUDA's FP8 GEMM takes its second operand so.
at::Tensor column_major(const at::Tensor& t) { return t.t().contiguous().t(); }

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b_col, const at::Tensor& sa, const at::Tensor& sb,
                     c10::ScalarType out) {
  // _scaled_mm multiplies by its scales: the dequantisation factors 1/scale. Autocast off: on
  // CPU the emulation's own fp32 matmul would otherwise be cast to bf16 (and autocast is on in
  // a pipeline's backward), losing the fp32 accumulation the recipe promises.
  AutocastOff fp32;
  return at::_scaled_mm(a, b_col, sa.reciprocal(), sb.reciprocal(), std::nullopt, std::nullopt, out);
}

c10::ScalarType output_dtype(const at::Tensor& x) {
  const AutocastSwitch a = autocast_switch(x.device().type());
  return a.enabled ? a.dtype : x.scalar_type();
}

struct Fp8Fn : torch::autograd::Function<Fp8Fn> {
  // `record`: GradMode as the caller had it (a Function's forward runs with it off).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, Fp8Linear* state,
                            bool record) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const at::Tensor sx = state->scale(Fp8Linear::kInput, x2, record);
    const at::Tensor sw = state->scale(Fp8Linear::kWeight, w, record);
    const at::Tensor xq = fp8_quantize(x2, sx, Fp8Format::E4M3), wq = fp8_quantize(w, sw, Fp8Format::E4M3);
    state->note_weight_copy(wq.numel());  // one byte an element
    at::Tensor y = scaled_mm(xq, column_major(wq.t()), sx, sw, output_dtype(x));
    const bool defer = weight_grads_deferrable() && w.requires_grad();
    // The weight itself only for a deferred gradient: the leaf whose .grad the W pass adds to.
    ctx->save_for_backward({xq, wq, sx, sw, defer ? w : at::Tensor()});
    ctx->saved_data["state"] = reinterpret_cast<int64_t>(state);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->saved_data["defer"] = defer;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xq = saved[0], &wq = saved[1], &sx = saved[2], &sw = saved[3];
    auto* state = reinterpret_cast<Fp8Linear*>(ctx->saved_data["state"].toInt());
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const at::Tensor dy = grads[0].reshape({-1, grads[0].size(-1)});
    const at::Tensor sg = state->scale(Fp8Linear::kGrad, dy, true);
    const at::Tensor gq = fp8_quantize(dy, sg, Fp8Format::E5M2);
    // dx = dy W: [n, out] x [out, in]; W as the forward quantised it.
    at::Tensor dx = scaled_mm(gq, column_major(wq), sg, sw, x_dtype).view(ctx->saved_data["x_shape"].toIntVector());
    if (!ctx->saved_data["w_grad"].toBool()) return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    // dW = dyᵀ x: [out, n] x [n, in], accumulated in fp32, in the weight's dtype.
    auto dw = [gq, xq, sg, sx, w_dtype] { return scaled_mm(gq.t().contiguous(), column_major(xq), sg, sx, w_dtype); };
    WeightGradStash* stash = weight_grad_target();
    if (stash && ctx->saved_data["defer"].toBool()) {
      // Zero-bubble's W pass computes it later (nn/linear.h).
      stash->add_deferred(saved[4], dw);
      return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    return {dx, dw(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

double fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0 : 57344.0; }

c10::ScalarType fp8_dtype(Fp8Format f) {
  return f == Fp8Format::E4M3 ? c10::ScalarType::Float8_e4m3fn : c10::ScalarType::Float8_e5m2;
}

Fp8Scaling parse_fp8_scaling(const std::string& s) {
  if (s == "current") return Fp8Scaling::Current;
  if (s == "delayed") return Fp8Scaling::Delayed;
  throw std::invalid_argument(fmt::format("fp8_scaling '{}' unknown; use current or delayed", s));
}

const char* to_string(Fp8Scaling s) { return s == Fp8Scaling::Current ? "current" : "delayed"; }

at::Tensor fp8_scale(const at::Tensor& amax, Fp8Format f, int64_t margin) {
  return (fp8_max(f) / std::ldexp(1.0, static_cast<int>(margin))) / amax.to(at::kFloat).clamp_min(kAmaxFloor);
}

at::Tensor fp8_quantize(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  const double m = fp8_max(f);
  return (x.to(at::kFloat) * scale).clamp(-m, m).to(fp8_dtype(f));
}

Fp8Linear::Fp8Linear(Fp8Recipe r, std::vector<Comm*> shared, c10::Device device) : recipe_(r) {
  if (r.history < 1) throw std::invalid_argument(fmt::format("fp8 amax history {} must be >= 1", r.history));
  if (r.margin < 0) throw std::invalid_argument(fmt::format("fp8 margin {} must be >= 0", r.margin));
  for (Comm* g : shared) {
    if (g && g->size() > 1) shared_.push_back(g);
  }
  const auto o = at::TensorOptions().dtype(at::kFloat).device(device);
  history_ = at::zeros({3, r.history}, o);
  scales_ = at::ones({3}, o);
  step_amax_ = at::zeros({3}, o);
}

at::Tensor Fp8Linear::reduced_amax(const at::Tensor& t) {
  at::Tensor a = t.detach().abs().amax().to(at::kFloat);
  for (Comm* g : shared_) g->all_reduce(a, ReduceOp::Max);
  return a;
}

at::Tensor Fp8Linear::scale(Role role, const at::Tensor& t, bool record) {
  const Fp8Format f = role == kGrad ? Fp8Format::E5M2 : Fp8Format::E4M3;
  if (recipe_.scaling == Fp8Scaling::Delayed && pushed_) {
    if (record) {
      const at::Tensor a = t.detach().abs().amax().to(at::kFloat);
      step_amax_[role].copy_(at::maximum(step_amax_[role], a));
    }
    return scales_[role];
  }
  const at::Tensor a = reduced_amax(t);
  if (record && recipe_.scaling == Fp8Scaling::Delayed) step_amax_[role].copy_(at::maximum(step_amax_[role], a));
  return fp8_scale(a, f, recipe_.margin);
}

void Fp8Linear::push(const at::Tensor& amax) {
  at::NoGradGuard no_grad;
  history_ = at::cat({amax.to(history_.options()).reshape({3, 1}), history_.narrow(1, 0, recipe_.history - 1)}, 1);
  derive_scales();
}

void Fp8Linear::derive_scales() {
  pushed_ = true;
  step_amax_.zero_();
  const at::Tensor a = std::get<0>(history_.max(1));
  for (int64_t r = 0; r < 3; ++r) {
    scales_[r].copy_(fp8_scale(a[r], r == kGrad ? Fp8Format::E5M2 : Fp8Format::E4M3, recipe_.margin));
  }
}

void Fp8Linear::restore(const at::Tensor& history) {
  if (history.sizes() != history_.sizes()) {
    throw std::invalid_argument(fmt::format("fp8 amax history of {} steps in the checkpoint, {} expected: set "
                                            "train.fp8_history = {} to resume it",
                                            history.dim() == 2 ? history.size(1) : -1, recipe_.history,
                                            history.dim() == 2 ? history.size(1) : -1));
  }
  at::NoGradGuard no_grad;
  history_.copy_(history);
  derive_scales();
}

at::Tensor Fp8Linear::forward(const at::Tensor& x, const at::Tensor& w) {
  return Fp8Fn::apply(x, w, this, at::GradMode::is_enabled());
}

}  // namespace meshtrain::nn
