// Ring attention (Liu, Zaharia, Abbeel, arXiv 2310.01889) on zig-zag chunks,
// as a custom autograd op.
//
// Each rank keeps its queries; the K/V blocks travel round the cp ring: at step
// i = 0 .. cp-1 rank r holds the block of rank (r - i) mod cp, sends it on to
// r + 1 and receives the next from r - 1 asynchronously (double-buffered: two
// blocks alive) while it computes tiled attention (nn/tiled_attention.h) of its
// queries on the block in hand. Partial results merge by log-sum-exp:
//   lse = log(exp(lse_a) + exp(lse_b)),  O = exp(lse_a - lse) O_a + exp(lse_b - lse) O_b
// Of the 2 x 2 chunk pairs of a step, a key chunk before the query chunk is
// attended in full, the same chunk causally, a later one not at all (zig-zag:
// every rank does 2·cp + 1 chunk-pairs).
//
// Backward: the blocks travel the same way; each rank computes its queries'
// share of dQ, dK, dV with the saved merged O and lse (FlashAttention-2's
// backward with the whole softmax's statistics), and the dK/dV accumulator of
// each block travels with it one hop behind, gathering every rank's share,
// until the last hop brings it home: K/V go round cp - 1 hops, dK/dV cp.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "meshtrain/nn/tiled_attention.h"

namespace meshtrain {

class Comm;

// q [b, hq, n, d], k, v [b, hkv, n, d]: this rank's n = S / cp zig-zag tokens
// (parallel/context/zigzag.h). Returns the rows of causal attention over the
// whole sequence that belong to this rank's queries, [b, hq, n, d] in q's dtype.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                          const nn::TiledAttentionOptions& o = {});

// Time inside ring attention on this process, forward and backward: all of it,
// and the part spent waiting for a K/V (or dK/dV) block that had not arrived
// when the computation on the block in hand was done (communication not hidden).
struct RingStats {
  double total_s = 0, wait_s = 0;
  int64_t hops = 0;  // blocks received
};
RingStats& ring_stats();

}  // namespace meshtrain
