// Stateless layer math on [seq, batch, ...] tensors (Megatron's layout: the
// sequence dim first, so sequence-parallel shards are contiguous).
#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain::nn {

// x * rsqrt(mean(x^2) + eps) * weight, over the last dim (Zhang & Sennrich 2019).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

// Rotary position embedding (Su et al., arXiv 2104.09864), "rotate half"
// convention of Llama / HF: x is [batch, heads, seq, head_dim], positions
// 0..seq-1.
at::Tensor rope(const at::Tensor& x, double theta);

// Causal attention. q: [b, hq, s, d]; k, v: [b, hkv, s, d] with hq a multiple of
// hkv (GQA/MQA: each kv head serves hq/hkv query heads). Returns [b, hq, s, d].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout, bool train);

}  // namespace meshtrain::nn
