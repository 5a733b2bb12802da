// What reaches a leaf's AccumulateGrad node (tests of nn/linear.h's fused accumulation).
#pragma once

#include <memory>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace meshtrain::test {

// Records whether W's AccumulateGrad node was handed a gradient (no: the GEMM added it itself).
// A hook on the node, not on the tensor's gradient, so the fusion does not step aside for it.
struct HandedToAccumulator : torch::autograd::FunctionPreHook {
  std::shared_ptr<bool> handed = std::make_shared<bool>(false);
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    *handed = grads[0].defined();
    return grads;
  }
};

// Keeps W's accumulator alive (the tensor holds it weakly) and reports what reached it.
inline std::pair<std::shared_ptr<torch::autograd::Node>, std::shared_ptr<bool>> watch_accumulator(const at::Tensor& w) {
  auto acc = torch::autograd::impl::grad_accumulator(w);
  auto hook = std::make_unique<HandedToAccumulator>();
  std::shared_ptr<bool> handed = hook->handed;
  acc->add_pre_hook(std::move(hook));
  return {std::shared_ptr<torch::autograd::Node>(acc), handed};
}

}  // namespace meshtrain::test
