// The experts of one mixture-of-experts layer, computed grouped: the tokens'
// assignments (moe/router.h) sorted by expert, each expert's rows gathered
// and multiplied in one GEMM per weight (a loop over experts, never over
// tokens), the outputs scattered back weighted by the gates:
//
//   y_t = sum_j gate[t, j] * expert_{e[t, j]}(x_t)
//
// over the assignments the capacity kept. An expert is an FFN of its own:
// GELU (w2 gelu(w1 x)) or SwiGLU (w2 (silu(w1 x) * w3 x)), weights stacked
// over the experts. With expert parallelism the same function runs on the
// tokens dispatched to this rank's experts.
#pragma once

#include <ATen/core/Tensor.h>

#include "meshtrain/moe/router.h"

namespace meshtrain {

struct ExpertWeights {
  at::Tensor w1;  // [E, f, h]: GELU's first linear, SwiGLU's gate
  at::Tensor w3;  // [E, f, h]: SwiGLU's up (undefined for GELU)
  at::Tensor w2;  // [E, h, f]: the second linear (SwiGLU's down)
};

// One expert's FFN on rows x [n, h].
at::Tensor expert_ffn(const at::Tensor& x, const ExpertWeights& w, int64_t e);

// x [T, h], the routing of its T tokens: y [T, h] (zero rows for tokens whose
// every assignment was dropped). Differentiable in x, the weights and the gates.
at::Tensor run_experts(const at::Tensor& x, const Routing& r, const ExpertWeights& w);

}  // namespace meshtrain
