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
// in one pass over key tiles (FlashAttention-2's loop order): a work item owns
// its key tile's dK, dV (every query head of its kv group: GQA without
// repeating K/V) and adds its dQ share into its thread's own copy of dQ, the
// copies summed at the end, so no two threads write one tile. Tiles the mask
// hides entirely are skipped (causal: those above the diagonal, about half).
//
// Attention dropout (FlashAttention's, arXiv 2205.14135 Algorithm 2): the
// softmax statistics m, l, lse are those of the undropped P; O accumulates
// (P ∘ Z) V / (1 - p) with Z the keyed keep mask (nn/keyed_dropout.h) of
// (key; row, head, query position, key position), made per tile, so backward
// makes the same Z without storing it: dV += (P ∘ Z)ᵀ dO / (1 - p), dP =
// (dO Vᵀ) ∘ Z / (1 - p), and D = rowsum(dO ∘ O) = rowsum(P ∘ dP) as without
// dropout. Z does not depend on the tile sizes, and equals the mask that
// causal_attention is given for the same coordinates (nn/functional.h).
//
// Rows that see no key (padding) give O = 0, lse = -inf, and zero gradients.
// bf16 inputs are computed in fp32 (accumulation and softmax) and the output
// is cast back. Work is split over (batch, head, tile) with at::parallel_for.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/plan/spec.h"

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
  int64_t block_q = plan::kAttentionTile, block_k = plan::kAttentionTile;
  double dropout = 0;  // probability of dropping an attention probability
  // The dropout masks' key, and the global coordinates of this call's rows and first head
  // (rows empty: 0..b-1). Query i's position is q_offset + i, key j's is j.
  uint64_t key = 0;
  std::vector<int64_t> rows = {};
  int64_t head_offset = 0;
};

// The keep mask the op applies with `o` (dropout > 0) to causal queries at t - s..t - 1,
// materialised [b, hq, s, t] as 0 or 1 / (1 - p): for tests that check the op against naive attention.
at::Tensor tiled_dropout_mask(int64_t b, int64_t hq, int64_t s, int64_t t, const TiledAttentionOptions& o);

// q: [b, hq, s, d]; k, v: [b, hkv, t, d], hq a multiple of hkv (query head h
// reads kv head h / (hq / hkv)). Returns [b, hq, s, d] in q's dtype; differentiable.
at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionMask& mask = {}, const TiledAttentionOptions& o = {});

// The forward alone, also returning the log-sum-exp of every row ([b, hq, s],
// fp32; -inf for rows that see no key). No autograd.
std::tuple<at::Tensor, at::Tensor> tiled_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const AttentionMask& mask = {},
                                                           const TiledAttentionOptions& o = {});

// The IO model of the FlashAttention paper (Dao et al., arXiv 2205.14135,
// Theorem 2): elements moved between main memory and the cache by causal
// attention forward + backward, per head, at s tokens of head_dim d.
//   naive: the s x s scores are written and read back by every step that
//          touches them (forward: S written, read, P written, read for PV;
//          backward: P read, dP written and read, dS written, read twice):
//          about 10 s² + 8 s·d.
//   tiled: forward reads K and V once per query tile of B rows, Q once and
//          writes O: 2 s·d x s/B + 2 s·d; backward (one pass over key tiles)
//          reads Q and dO and updates dQ once per key tile, and K, V, dK, dV
//          once: 4 s·d x s/B + 4 s·d; about 6 s² d / B + 6 s·d.
inline double naive_attention_io(double s, double d) { return 10 * s * s + 8 * s * d; }
inline double tiled_attention_io(double s, double d, double block) { return 6 * s * s * d / block + 6 * s * d; }

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
