// Context parallelism: causal attention over a sequence whose tokens are spread
// over the cp group in zig-zag order (parallel/context/zigzag.h). Every
// function takes this rank's q [b, hq, n, d] and k, v [b, hkv, n, d] (n = S / cp)
// and returns this rank's rows of whole-sequence attention, [b, hq, n, d]:
// the same numbers as one process computing attention over all S tokens.
//
//   ring       K/V blocks round the ring, overlapped with compute (ring_attention.h).
//              Traffic per rank: (cp-1) K/V blocks forward, (cp-1) K/V + cp dK/dV backward.
//   ulysses    all-to-all from sequence shards to head shards (each rank: all S
//              tokens of hq/cp heads), local attention, all-to-all back
//              (Jacobs et al., arXiv 2309.14509). Needs hq divisible by cp; with
//              fewer kv heads than cp the kv heads are repeated to hq first.
//   allgather  K/V of the whole sequence all-gathered, local queries attend to
//              the keys up to their chunk's end; dK/dV reduce-scattered back
//              (Llama 3, arXiv 2407.21783 sec. 3.3.2).
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

#include "meshtrain/plan/strategy.h"

namespace meshtrain {

class Comm;

// Causal attention of q [b, hq, s, d] on k, v [b, hkv, t, d], t >= s, the
// queries at the last s of the t positions (naive or tiled: the model's choice).
using AttentionCore = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// Dispatches on `impl`; ring always computes with tiled attention (it merges
// blocks by their log-sum-exp), the others with `core`.
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                             plan::CpImpl impl, const AttentionCore& core);

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                             const AttentionCore& core);
at::Tensor allgather_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                                  const AttentionCore& core);

}  // namespace meshtrain
