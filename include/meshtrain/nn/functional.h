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
// start..start+seq-1.
at::Tensor rope(const at::Tensor& x, double theta, int64_t start = 0);
// The same at any positions: [seq] int64 (context parallelism's zig-zag
// tokens), or [batch, seq] (positions restarting at each packed document).
at::Tensor rope(const at::Tensor& x, double theta, const at::Tensor& positions);

// Causal attention. q: [b, hq, s, d]; k, v: [b, hkv, t, d] with t >= s and hq
// a multiple of hkv (GQA/MQA: each kv head serves hq/hkv query heads). The
// queries are the last s positions of the t (t > s: decoding with a KV cache):
// query i sees keys 0..t-s+i. Returns [b, hq, s, d]. With dropout > 0, the attention
// probabilities are multiplied by `keep` / (1 - dropout) (keep: [b, hq, s, t], 1 or 0,
// from nn/keyed_dropout.h).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout = 0,
                            const at::Tensor& keep = {});

// The same causal attention (t == s) through at::scaled_dot_product_attention, no dropout.
at::Tensor sdpa_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace meshtrain::nn
