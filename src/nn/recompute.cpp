#include "meshtrain/nn/recompute.h"

#include "meshtrain/compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <stdexcept>

namespace meshtrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides the saved inputs: the function and the
// generator states of the first run.
struct Closure : torch::CustomClassHolder {
  TensorFn fn;
  std::vector<at::Generator*> rngs;
  std::vector<at::Tensor> rng_states;
  // Mixed precision of the first run (train/precision.h), per device type.
  AutocastSwitch cpu_autocast, cuda_autocast;
};

// The re-run computes in the precision of the first run: backward runs
// outside the forward's autocast region, so it is re-entered here (and its
// cache of cast weights dropped afterwards: weights change at the step).
struct SameAutocast {
  AutocastSwitch was_cpu = autocast_switch(c10::DeviceType::CPU), was_cuda = autocast_switch(c10::DeviceType::CUDA);
  explicit SameAutocast(const Closure& c) {
    set_autocast_switch(c10::DeviceType::CPU, c.cpu_autocast);
    set_autocast_switch(c10::DeviceType::CUDA, c.cuda_autocast);
    at::autocast::increment_nesting();
  }
  ~SameAutocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_autocast_switch(c10::DeviceType::CPU, was_cpu);
    set_autocast_switch(c10::DeviceType::CUDA, was_cuda);
  }
};

at::Tensor get_state(at::Generator* g) {
  std::lock_guard<std::mutex> lock(g->mutex());
  return g->get_state();
}
void set_state(at::Generator* g, const at::Tensor& s) {
  std::lock_guard<std::mutex> lock(g->mutex());
  g->set_state(s);
}

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // `inputs` as a TensorList: that is what autograd recognises as a list of
  // variables (a std::vector argument would be treated as a constant).
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Closure> c) {
    for (auto* g : c->rngs) c->rng_states.push_back(get_state(g));
    c->cpu_autocast = autocast_switch(c10::DeviceType::CPU);
    c->cuda_autocast = autocast_switch(c10::DeviceType::CUDA);
    variable_list out = c->fn(inputs.vec());  // grad mode is off inside forward
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["closure"] = c10::IValue::make_capsule(c);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto c = c10::static_intrusive_pointer_cast<Closure>(ctx->saved_data["closure"].toCapsule());
    variable_list inputs = ctx->get_saved_variables();
    variable_list detached;
    for (const auto& x : inputs) {
      at::Tensor d = x.detach();
      if (x.requires_grad()) d.requires_grad_(true);
      detached.push_back(d);
    }
    std::vector<at::Tensor> now;
    for (auto* g : c->rngs) now.push_back(get_state(g));
    for (size_t i = 0; i < c->rngs.size(); ++i) set_state(c->rngs[i], c->rng_states[i]);
    variable_list out;
    {
      at::AutoGradMode enable(true);
      SameAutocast precision(*c);
      out = c->fn(detached);
    }
    for (size_t i = 0; i < c->rngs.size(); ++i) set_state(c->rngs[i], now[i]);
    variable_list roots, root_grads;
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].requires_grad() && grads[i].defined()) {
        roots.push_back(out[i]);
        root_grads.push_back(grads[i]);
      }
    }
    // Reentrant backward: parameters accumulate into .grad, inputs into theirs.
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list result;
    for (const auto& d : detached) result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    result.push_back(at::Tensor());  // the closure
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(TensorFn fn, const std::vector<at::Tensor>& inputs, std::vector<at::Generator*> rngs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);  // nothing to save: evaluation
  auto c = c10::make_intrusive<Closure>();
  c->fn = std::move(fn);
  c->rngs = std::move(rngs);
  return Checkpoint::apply(at::TensorList(inputs), c);
}

}  // namespace meshtrain::nn
