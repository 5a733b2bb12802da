// The matrix multiplies of one training step of a dense model on one process
// (tp = 1, naive attention): forward and backward, as the model runs them.
// The floor a step's time cannot go below; `meshtrain bench gemm` times them
// alone (bench/train.sh reports step time / GEMM time).
//
// Per layer, for each linear y = x Wᵀ (x [N, in], W [out, in], N = tokens):
//   forward  y  = x Wᵀ       [N, in] x [in, out]
//   backward dx = dy W       [N, out] x [out, in]
//            dW = dyᵀ x      [out, N] x [N, in]
// and attention per (sequence, head), s positions, head dimension d:
//   forward  S = Q Kᵀ [s, d] x [d, s],  O = P V [s, s] x [s, d]
//   backward dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q
// (GQA's keys and values are repeated to every query head first, as
// nn::causal_attention does). The output layer (tied or not) is one linear
// h -> padded vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

// C [batch, m, n] = op(A) [m, k] x op(B) [k, n]; A is stored [k, m] when
// trans_a (a transposed view), B [n, k] when trans_b.
struct Gemm {
  std::string name;  // "fc1 forward", "attention dK", ...
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t count = 1;  // times per step
  double flops() const { return 2.0 * static_cast<double>(batch * m * n * k * count); }
};

// Throws std::invalid_argument for MoE models (their expert GEMMs depend on routing).
// The output layer has the vocabulary padded as the model pads it on one process (128).
std::vector<Gemm> step_gemms(const ModelSpec& m, int64_t micro_batch, int64_t seq);

}  // namespace meshtrain::plan
