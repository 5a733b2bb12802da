#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain {

// What a parameter-efficient method attaches to a linear. The layers see these
// interfaces only (peft/lora.h's LoraAdapter and peft/qlora.h's Nf4Weight
// implement them), so tensor parallelism does not depend on the methods above it.
struct LinearDelta {
  virtual ~LinearDelta() = default;
  virtual bool active() const = 0;  // false: the base alone
  // The term added to the layer's product (before a row region's reduction);
  // `train`: with its dropout.
  virtual at::Tensor delta(const at::Tensor& x, bool train) const = 0;
};
struct PackedWeight {
  virtual ~PackedWeight() = default;
  // x Wᵀ from the packed form (no bias), differentiable in x.
  virtual at::Tensor linear(const at::Tensor& x) const = 0;
};

}  // namespace meshtrain
