// Internal: AdamW's update of one fp32 tensor in a single pass (optim/adamw.h).
//
// The unfused update reads and writes the tensors six times and allocates the
// clipped gradient and the denominator; this pass reads p, g, m, v once and
// writes p, m, v once, split across ATen's threads. It applies the same
// operations in the same order as the unfused one, per element:
//   g' = g clip;  m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g' g'
//   p = p (1 - lr wd);  p = p - (lr / bc1) m / (sqrt(v / bc2) + eps)
// in fp32 (the state's and the master weights' dtype).
#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain {

struct AdamWCoefficients {
  float clip = 1, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.05f;  // rounded from double, as the unfused ops do
  float keep = 1;  // 1 - lr wd (1: no decay)
  float step = 0;  // lr / (1 - b1^t)
  float bc2 = 1;   // 1 - b2^t
};

// p, g, m, v: contiguous fp32 tensors of the same size. Returns false (and
// touches nothing) when they are not, for the caller's unfused path.
bool fused_adamw_update(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                        const AdamWCoefficients& c);

}  // namespace meshtrain
