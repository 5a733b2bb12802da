// The loops under nn/fused_ops.h: raw pointers, no ATen, so that the compiler
// vectorises them (one clone per instruction set, chosen at run time) with the
// roundings written here (no contraction into FMAs): the same bits on every CPU.
//
// Element types: float, or bf16 (uint16_t, the high half of a float; stores
// round to nearest even, as c10::BFloat16 does). Each call handles a range of
// rows; the caller splits rows over threads. Column sums (the gradients of a
// bias or a norm's weight) are written per block of kRowBlock rows into
// `partial` ([blocks, cols]) and summed by block_sums in block order, so the
// result does not depend on the number of threads.
#pragma once

#include <cstdint>

namespace meshtrain::nn::kernels {

constexpr int64_t kRowBlock = 16;

enum class Elem { F32, Bf16 };

// gelu_tanh(x + bias) = (x + bias) σ(2z), z = √(2/π) (u + 0.044715 u³), u = x + bias
// (Hendrycks & Gimpel, arXiv 1606.08415; 0.5 (1 + tanh z) = σ(2z)).
struct BiasGeluArgs {
  const void* x;
  Elem type;
  const float* bias;  // [cols] or nullptr
  int64_t cols;
};
void bias_gelu_forward(const BiasGeluArgs& a, void* y, int64_t row0, int64_t row1);
// dx = dy gelu'(u); bias_partial (when not null) gets Σ dx per block; rows
// start at a block boundary.
void bias_gelu_backward(const BiasGeluArgs& a, const void* dy, void* dx, float* bias_partial, int64_t row0,
                        int64_t row1);

// silu(g) u = g σ(g) u (Shazeer, arXiv 2002.05202) over n elements.
void swiglu_forward(const void* gate, const void* up, Elem type, void* y, int64_t i0, int64_t i1);
void swiglu_backward(const void* gate, const void* up, Elem type, const void* dy, void* dgate, void* dup, int64_t i0,
                     int64_t i1);

// One row r of the residual step of a pre-norm block:
//   s = residual + keep·scale·(branch + bias)          (each term optional)
//   y = (s − mean)·rstd·w + b   (LayerNorm; Ba et al., arXiv 1607.06450)
//   y = s·rstd·w                (RMSNorm, mean 0; Zhang & Sennrich, arXiv 1910.07467)
// rstd = 1/√(var + eps) (LayerNorm: the biased variance; RMSNorm: mean(s²)).
struct RowArgs {
  int64_t cols = 0;
  const float* residual = nullptr;  // [rows, cols]
  const void* branch = nullptr;     // [rows, cols], of `type`
  Elem type = Elem::F32;
  const float* bias = nullptr;  // [cols]
  const void* keep = nullptr;   // [rows, cols] 0/1, of `type`
  float scale = 1;              // 1 / (1 - p)
  bool norm = false;
  bool rms = false;
  const float* w = nullptr;  // [cols]; with norm
  const float* b = nullptr;  // [cols] or nullptr (LayerNorm's shift)
  float eps = 0;
};
// Writes s (sum, when not null), y, mean and rstd (with norm).
void rows_forward(const RowArgs& a, float* sum, float* y, float* mean, float* rstd, int64_t row0, int64_t row1);

// The gradient: given s (the saved sum), mean, rstd and the output gradients
// dy (of y; with norm) and ds_out (of s; nullptr: zero):
//   g = dy·w, ŝ = (s − mean)·rstd
//   ds = ds_out + rstd·(g − mean(g) − ŝ·mean(g·ŝ))    (RMSNorm: without mean(g))
//   d_residual = ds, d_branch = ds·keep·scale
// and per block: Σ d_branch (bias), Σ dy·ŝ (w), Σ dy (b). Null outputs are skipped.
struct RowGradOut {
  float* d_residual = nullptr;
  void* d_branch = nullptr;  // of RowArgs::type
  float* bias_partial = nullptr;
  float* w_partial = nullptr;
  float* b_partial = nullptr;
};
void rows_backward(const RowArgs& a, const float* s, const float* mean, const float* rstd, const float* dy,
                   const float* ds_out, const RowGradOut& out, int64_t row0, int64_t row1);

// out[c] = Σ_k partial[k, c] for k = 0..blocks-1 in order.
void block_sums(const float* partial, int64_t blocks, int64_t cols, float* out);

}  // namespace meshtrain::nn::kernels
