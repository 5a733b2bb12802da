#include "meshtrain/nn/linear.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

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

struct DeferredLinear : torch::autograd::Function<DeferredLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor dx = at::matmul(dy, w.to(dy.scalar_type())).to(x.scalar_type());
    if (target) {
      target->add(w, x, dy);  // W later; AccumulateGrad gets no gradient now
      return {dx, at::Tensor()};
    }
    return {dx, weight_grad(x, dy, w)};
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

bool weight_grads_deferrable() { return defer_in_forward; }
WeightGradStash* weight_grad_target() { return target; }

DeferWeightGrads::DeferWeightGrads() : was_(defer_in_forward) { defer_in_forward = true; }
DeferWeightGrads::~DeferWeightGrads() { defer_in_forward = was_; }

WeightGradTarget::WeightGradTarget(WeightGradStash* stash) : was_(target) { target = stash; }
WeightGradTarget::~WeightGradTarget() { target = was_; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!defer_in_forward || !at::GradMode::is_enabled() || !weight.requires_grad()) return at::linear(x, weight, bias);
  // The bias's gradient (a sum over dy) is cheap: an ordinary node computes it in B.
  at::Tensor y = DeferredLinear::apply(x, weight);
  return bias.defined() ? y + bias : y;
}

}  // namespace meshtrain::nn
