// Tiled attention (FlashAttention-2: Dao, arXiv 2307.08691), a custom autograd
// op on the CPU: the s x t score matrix is never materialised.
//
// Forward, for each (batch, query head, query tile Qi of Bq rows), over the key
// tiles Kj, Vj of Bk rows that the mask leaves visible (online softmax):
//   S   = Qi Kjᵀ · scale                       [Bq, Bk], masked entries -inf
//   m'  = max(m, rowmax(S));  P = exp(S - m')
//   l   = exp(m - m') l + rowsum(P)
//   O   = exp(m - m') O + P Vj
// then O /= l and lse = m + log l (the row's log-sum-exp) — all that is kept
// for backward besides q, k, v and O: O(s) memory, not O(s·t).
// Backward recomputes P = exp(S - lse) tile by tile with D = rowsum(dO ∘ O):
//   dVj += Pᵀ dOi;  dP = dOi Vjᵀ;  dS = P ∘ (dP - D);  dQi += dS Kj · scale;  dKj += dSᵀ Qi · scale
// in two passes so that no two threads write one tile: one over key tiles
// (dK, dV; every query head of a kv group, GQA without repeating K/V), one
// over query tiles (dQ). Tiles the mask hides entirely are skipped (causal:
// those above the diagonal, about half).
//
// Rows that see no key (padding) give O = 0, lse = -inf, and zero gradients.
// bf16 inputs are computed in fp32 (accumulation and softmax) and the output
// is cast back. Work is split over (batch, head, tile) with at::parallel_for.
#pragma once

#include <cstdint>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace meshtrain::nn {

// Which keys a query sees. Query i (of s) sits at position q_offset + i of
// the t keys (q_offset = t - s when t > s: decoding after a KV cache).
struct AttentionMask {
  bool causal = true;   // key j only if j <= position of i
  int64_t window = 0;   // > 0: also only if j > position of i - window (sliding window)
  // Packed sequences: [b, t] int64 document id per key position (the queries
  // take ids q_offset.. of it). A query sees keys of its own document only; an
  // id < 0 is padding: it sees nothing and is seen by nothing. Undefined: one document.
  at::Tensor doc_ids;
  int64_t q_offset = -1;  // -1: t - s
};

// Tile sizes. Each tile costs a dozen ATen calls, whose overhead dominates
// small tiles on a CPU: `meshtrain lab 07` times 64 to 512 (and
// `meshtrain bench attention --block B` any size) against the materialised scores.
struct TiledAttentionOptions {
  int64_t block_q = 512, block_k = 512;
};

// q: [b, hq, s, d]; k, v: [b, hkv, t, d], hq a multiple of hkv (query head h
// reads kv head h / (hq / hkv)). Returns [b, hq, s, d] in q's dtype; differentiable.
at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionMask& mask = {}, const TiledAttentionOptions& o = {});

// The forward alone, also returning the log-sum-exp of every row ([b, hq, s],
// fp32; -inf for rows that see no key). No autograd.
std::tuple<at::Tensor, at::Tensor> tiled_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const AttentionMask& mask = {},
                                                           const TiledAttentionOptions& o = {});

// The backward alone, from a forward's output and log-sum-exp (fp32): returns
// dq, dk, dv in fp32. `out` and `lse` may come from a larger problem whose
// keys this call sees only part of (ring attention: the merged output and
// log-sum-exp of every key block); then P = exp(S - lse) and
// D = rowsum(dout ∘ out) are the whole softmax's, and the returned gradients
// are this key block's share, summing to the whole over the blocks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tiled_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, const AttentionMask& mask = {}, const TiledAttentionOptions& o = {});

}  // namespace meshtrain::nn
