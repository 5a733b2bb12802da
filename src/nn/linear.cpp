#include "meshtrain/nn/linear.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>

#include "meshtrain/compat.h"

namespace meshtrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local bool defer_in_forward = false;
thread_local WeightGradStash* target = nullptr;

// dyᵀ x over all leading dimensions, in dy's dtype, as `like`'s dtype.
at::Tensor weight_grad(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& like) {
  const at::Tensor d = dy.reshape({-1, dy.size(-1)});
  return at::mm(d.t(), x.reshape({-1, x.size(-1)}).to(d.scalar_type())).to(like.scalar_type());
}

void accumulate(const at::Tensor& weight, const at::Tensor& g) {
  at::Tensor& grad = const_cast<at::Tensor&>(weight).mutable_grad();
  if (grad.defined()) {
    grad.add_(g);
  } else {
    grad = g;
  }
}

// y = x Wᵀ (+ b). The backward computes dx and db at once, and W's gradient in one of three ways:
// recorded for the W pass (a stash is the target), added by the GEMM itself into W's existing
// .grad (beta = 1), or returned for AccumulateGrad.
struct Linear : torch::autograd::Function<Linear> {
  // The bias is optional: an undefined tensor cannot be a Function's input.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["deferrable"] = defer_in_forward;
    if (!bias) return at::linear(x, weight);
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias->scalar_type());
    return at::linear(x, weight, *bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = at::matmul(dy, w.to(dy.scalar_type())).to(x.scalar_type());
    if (ctx->saved_data.count("bias_dtype") && ctx->needs_input_grad(2)) {
      db = dy.reshape({-1, dy.size(-1)}).sum(0).to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    }
    if (!ctx->needs_input_grad(1)) return {dx, dw, db};
    if (target && ctx->saved_data["deferrable"].toBool()) {
      target->add(w, x, dy);  // W later; AccumulateGrad gets no gradient now
    } else if (x.scalar_type() == dy.scalar_type() && grad_accumulates_in_place(w, dy.scalar_type())) {
      // Grad mode is off here (grad_accumulates_in_place checked it).
      w.grad().addmm_(dy.reshape({-1, dy.size(-1)}).t(), x.reshape({-1, x.size(-1)}));  // AccumulateGrad gets none
    } else {
      dw = weight_grad(x, dy, w);
    }
    return {dx, dw, db};
  }
};

}  // namespace

void WeightGradStash::add(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& dy) {
  items_.push_back({weight, [x, dy, weight] { return weight_grad(x, dy, weight); }});
}

void WeightGradStash::add_ready(const at::Tensor& weight, const at::Tensor& grad) {
  items_.push_back({weight, [grad] { return grad; }});
}

void WeightGradStash::add_deferred(const at::Tensor& weight, std::function<at::Tensor()> grad) {
  items_.push_back({weight, std::move(grad)});
}

void WeightGradStash::run() {
  at::NoGradGuard no_grad;
  for (const Item& i : items_) accumulate(i.weight, i.grad());
  items_.clear();
}

bool grad_accumulates_in_place(const at::Tensor& weight, at::ScalarType dtype) {
  if (at::GradMode::is_enabled() || !weight.is_leaf()) return false;  // a double backward; a gathered (ZeRO-3) weight
  // autograd::grad or backward(inputs=...): AccumulateGrad may not run, .grad must stay untouched.
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info && !exec_info->empty()) return false;
  if (!torch::autograd::impl::hooks(weight).empty() || torch::autograd::impl::post_acc_grad_hooks(weight)) return false;
  const at::Tensor& g = weight.grad();
  return g.defined() && g.layout() == at::kStrided && g.is_contiguous() && g.sizes() == weight.sizes() &&
         g.device() == weight.device() && g.scalar_type() == dtype;
}

bool weight_grads_deferrable() { return defer_in_forward; }
WeightGradStash* weight_grad_target() { return target; }

DeferWeightGrads::DeferWeightGrads() : was_(defer_in_forward) { defer_in_forward = true; }
DeferWeightGrads::~DeferWeightGrads() { defer_in_forward = was_; }

WeightGradTarget::WeightGradTarget(WeightGradStash* stash) : was_(target) { target = stash; }
WeightGradTarget::~WeightGradTarget() { target = was_; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!at::GradMode::is_enabled() || !weight.requires_grad()) return at::linear(x, weight, bias);
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (defer_in_forward) return Linear::apply(x, weight, b);
  // Under autocast the native node keeps the 16-bit weight it cast; this one would cast again in
  // the backward, and a 16-bit dW cannot be added into fp32 by the GEMM: at::linear's own node.
  const AutocastSwitch autocast = autocast_switch(x.device().type());
  if (autocast.enabled || x.scalar_type() != weight.scalar_type()) return at::linear(x, weight, bias);
  return Linear::apply(x, weight, b);
}

}  // namespace meshtrain::nn
