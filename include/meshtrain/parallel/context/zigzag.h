// Zig-zag sharding of a causal sequence over the cp ranks (Megatron-Core's
// context parallelism; ring-flash-attention's "zigzag"): the sequence of S
// tokens is cut into 2·cp chunks of S / (2·cp); rank r holds chunks r and
// 2·cp − 1 − r, in that order. Under a causal mask chunk c attends to c + 1
// chunks, so every rank does (r + 1) + (2·cp − r) = 2·cp + 1 chunk-pairs of
// work: equal on all ranks, where contiguous sharding would give the last rank
// 2·cp − 1 times the first's.
//
// "Rank-major" order is the concatenation of every rank's local tokens, rank 0
// first: what an all-gather or all-to-all of the local pieces produces.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

namespace meshtrain {

struct Batch;

class ZigZag {
 public:
  // Throws std::invalid_argument when seq is not a multiple of 2·cp (cp > 1).
  ZigZag(int64_t seq, int cp, int rank);

  int cp() const { return cp_; }
  int rank() const { return rank_; }
  int64_t seq() const { return seq_; }
  int64_t chunk() const { return chunk_; }  // S / (2·cp); S / 2 when cp = 1
  int64_t local() const { return 2 * chunk_; }

  // The global chunk ids rank r holds, in its local order.
  std::pair<int64_t, int64_t> chunks_of(int r) const { return {r, 2 * cp_ - 1 - r}; }
  // Global positions of this rank's local tokens, [local] int64.
  at::Tensor positions() const;
  // This rank's tokens of `x`, which holds the whole sequence along `dim`.
  at::Tensor shard(const at::Tensor& x, int64_t dim) const;
  // Index [S] that reorders a rank-major tensor into sequence order (index_select).
  at::Tensor natural_order() const;
  // Index [S] that reorders a tensor in sequence order into rank-major order.
  at::Tensor rank_major_order() const;

 private:
  int cp_, rank_;
  int64_t seq_, chunk_;
};

// A training batch's tokens and targets ([b, S]) cut to this cp rank's chunks.
Batch context_shard(const Batch& b, const ZigZag& z);

}  // namespace meshtrain
