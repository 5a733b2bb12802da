// Fused elementwise operations of a transformer block, each one pass forward
// and one pass backward (custom autograd nodes over the loops in
// src/nn/fused_kernels.h), saving no more than the backward reads:
//
//   bias_gelu(x, b)       gelu_tanh(x + b)              saves x (as at::gelu would)
//   swiglu(g, u)          silu(g) · u                   saves g, u (not silu(g))
//   norm(x, n)            LayerNorm or RMSNorm           saves x, mean, rstd
//   add_norm(r, x, a, n)  s = r + dropout(x + a.bias);  saves s, mean, rstd, the mask
//                         y = norm(s)                    (Megatron's bias-dropout-add
//                                                        fused with the next norm)
//
// Each equals its unfused composition (the functions named "reference" below)
// to fp32 rounding: the math is computed in fp32 whatever the inputs' type.
// Types: x, g, u, the branch and the mask in fp32 or bf16 (autocast's GEMM
// outputs); the residual, biases and norm weights in fp32; a norm's input and
// output and the sum in fp32. Other types or devices run the reference
// composition instead (same values, more passes).
#pragma once

#include <utility>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace meshtrain::nn {

struct NormWeights {
  at::Tensor weight;  // [h]; undefined: no norm (add_norm returns the sum only)
  at::Tensor bias;    // [h] (LayerNorm's shift); undefined for RMSNorm
  double eps = 1e-5;
  bool rms = false;
};

// What joins the branch to the residual: an optional bias, and dropout with
// probability p through `keep` (0/1 in the branch's type, nn::keyed_keep's mask).
struct BranchJoin {
  at::Tensor bias;
  at::Tensor keep;
  double p = 0;
};

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias);
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor norm(const at::Tensor& x, const NormWeights& n);
// {sum, norm(sum)}; the second undefined when n.weight is.
std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& residual, const at::Tensor& branch, const BranchJoin& j,
                                           const NormWeights& n);

// The unfused compositions (ATen operations), for tests and the fallbacks.
at::Tensor bias_gelu_reference(const at::Tensor& x, const at::Tensor& bias);
at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);
at::Tensor norm_reference(const at::Tensor& x, const NormWeights& n);
std::pair<at::Tensor, at::Tensor> add_norm_reference(const at::Tensor& residual, const at::Tensor& branch,
                                                     const BranchJoin& j, const NormWeights& n);

}  // namespace meshtrain::nn
