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

#include <cstdint>
#include <vector>

#include "meshtrain/moe/router.h"

namespace meshtrain {

class Comm;

struct ExpertWeights {
  at::Tensor w1;  // [E, f, h]: GELU's first linear, SwiGLU's gate
  at::Tensor w3;  // [E, f, h]: SwiGLU's up (undefined for GELU)
  at::Tensor w2;  // [E, h, f]: the second linear (SwiGLU's down)
};

// One expert's FFN on rows x [n, h].
at::Tensor expert_ffn(const at::Tensor& x, const ExpertWeights& w, int64_t e);

// Rows [n, h] sorted by expert, counts[e] of them for expert e of `w`: each
// expert's block in one GEMM per weight; outputs in the rows' order. The
// weights get a (zero) gradient even when no row reaches them.
at::Tensor grouped_ffn(const at::Tensor& rows, const std::vector<int64_t>& counts, const ExpertWeights& w);

// x [T, h], the routing of its T tokens: y [T, h] (zero rows for tokens whose
// every assignment was dropped). Differentiable in x, the weights and the gates.
// With `ep` (size > 1), `w` holds this rank's E/ep experts and the rows travel
// to the ranks holding their experts and back (moe/layer.h); every ep rank
// must call it, with or without tokens.
// `remote_rows` (optional): the rows this rank sent to and received from other
// ep ranks in the dispatch (the combine moves as many back).
at::Tensor run_experts(const at::Tensor& x, const Routing& r, const ExpertWeights& w, Comm* ep = nullptr,
                       int64_t* remote_rows = nullptr);

}  // namespace meshtrain
