#include "meshtrain/nn/functional.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>


namespace meshtrain::nn {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

at::Tensor rope(const at::Tensor& x, double theta, int64_t start) {
  return rope(x, theta, at::arange(start, start + x.size(2), at::TensorOptions().dtype(at::kLong).device(x.device())));
}

at::Tensor rope(const at::Tensor& x, double theta, const at::Tensor& positions) {
  const int64_t d = x.size(3);
  auto opts = at::TensorOptions().dtype(at::kFloat).device(x.device());
  // inv_freq[i] = theta^(-2i/d); angle[p, i] = p * inv_freq[i]
  at::Tensor inv_freq = at::pow(theta, at::arange(0, d, 2, opts) / static_cast<double>(d)).reciprocal();
  // [s, d/2], or [b, 1, s, d/2] for per-sequence positions
  at::Tensor angles = positions.dim() == 1 ? at::outer(positions.to(opts), inv_freq)
                                           : (positions.to(opts).unsqueeze(-1) * inv_freq).unsqueeze(1);
  at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1).to(x.scalar_type());
  at::Tensor sin = at::cat({angles.sin(), angles.sin()}, -1).to(x.scalar_type());
  at::Tensor x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
  at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

// PyTorch's fused attention (flash / memory-efficient / cuDNN on CUDA, a fused CPU kernel):
// softmax(q kᵀ / √d + causal mask) v, the naive path's computation without its [s, t] scores.
// Grouped-query heads are repeated as the naive path repeats them.
at::Tensor sdpa_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor kk = groups > 1 ? k.repeat_interleave(groups, 1) : k;
  at::Tensor vv = groups > 1 ? v.repeat_interleave(groups, 1) : v;
  return at::scaled_dot_product_attention(q, kk, vv, std::nullopt, 0.0, /*is_causal=*/true);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double p,
                            const at::Tensor& keep) {
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor kk = groups > 1 ? k.repeat_interleave(groups, 1) : k;
  at::Tensor vv = groups > 1 ? v.repeat_interleave(groups, 1) : v;
  const int64_t s = q.size(2), t = k.size(2);
  at::Tensor scores = at::matmul(q, kk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor future = at::ones({s, t}, q.options().dtype(at::kBool)).triu(1 + t - s);
  at::Tensor probs = at::softmax(scores.masked_fill(future, -INFINITY), -1, at::kFloat).to(q.scalar_type());
  if (p > 0 && keep.defined()) probs = probs * keep * (1.0 / (1.0 - p));
  return at::matmul(probs, vv);
}

}  // namespace meshtrain::nn
