#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain {

// What peft/adapter.h's bottleneck adapters implement: a -> f(a) after a
// block's attention and after its MLP (the model does not include peft).
struct OutputAdapter {
  virtual ~OutputAdapter() = default;
  virtual at::Tensor forward(const at::Tensor& a) const = 0;
};

}  // namespace meshtrain
