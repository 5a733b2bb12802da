// Stateless layer math on [seq, batch, ...] tensors (Megatron's layout: the
// sequence dim first, so sequence-parallel shards are contiguous).
#pragma once

#include <ATen/core/Generator.h>
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
// query i sees keys 0..t-s+i. Returns [b, hq, s, d]. With a generator and
// dropout > 0, attention probabilities are dropped with that probability.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout = 0,
                            at::Generator* gen = nullptr);

// The same causal attention (t == s) through at::scaled_dot_product_attention, no dropout.
at::Tensor sdpa_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Inverted dropout with masks drawn from `gen`: x * bernoulli(1 - p) / (1 - p).
// (An explicit generator, not the global one: which ranks share a mask is a
// property of the parallel layout, see Transformer.)
at::Tensor dropout(const at::Tensor& x, double p, at::Generator& gen);

}  // namespace meshtrain::nn
