// What one rank of meshtrain's runtime sends per training step on each
// communication group: the prediction `meshtrain train --check-plan` holds
// against the runtime's counters (comm.h's wire bytes: per rank, what a
// bandwidth-optimal algorithm sends; ring(n) = (n - 1) / n).
//
// Per micro-batch, with T = b x s x h x (4 bytes fp32, 2 bf16) the whole
// activation of one micro-batch (s = seq / cp):
//   tp   ring(tp) x T x (8 per layer: 4 collectives forward, 4 backward, with
//        or without sequence parallelism; + 4 with full recomputation;
//        + 2 for the embedding on the first stage, + 2 for the head on the
//        last) + the cross-entropy's 3 all-reduces of [s, b] fp32 (2 ring each);
//        with sequence parallelism, once per step, 2 ring(tp) 4 x the
//        sequence-partial parameters (norms, row-parallel biases, positions)
//   pp   sends: (2v - [first rank] - [last rank]) x T / (tp with SP)
//   cp   ring / Ulysses / all-gather K/V per layer (the formulas in traffic.cpp)
// Per step, P parameters on this rank, U0 of them outside the layers
// (embedding, positions, final norm, head), n ranks in ZeRO's shard group,
// R = dp / n replicas (HSDP), fp32 gradients (dp here is the reduction group,
// dp x cp, and n is all of it without HSDP):
//   dp   DDP 2 ring(dp) 4P;  ZeRO-1 ring(n) 4P (reduce-scatter) + ring(n) 4P
//        (all-gather); ZeRO-2 the reduce-scatter once per micro-batch;
//        ZeRO-3 per micro-batch ring(n) pb (2P - U0) of gathers (backward
//        gathers the layers again, not the embedding or the head; pb = 2 in
//        bf16, else 4) + ring(n) 4P;
//        HSDP + 2 ring(R) 4P/n per reduction; + the step's scalars.
//   embedding (tied, pp > 1, first and last stage): 2 ring(2) 4 E/tp.
// This is meshtrain's own accounting (fp32 master parameters gathered in
// fp32 by ZeRO-1/2, stage 2 reducing per micro-batch as DeepSpeed does); the
// planner's step estimate (plan/dp_time.h) has the same schedule of
// collectives but gathers parameters in their own 16-bit dtype and leaves
// out the small ones (the norm's sums, the sequence-partial parameters).
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/plan/partition.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

struct RankTraffic {
  double tp = 0, cp = 0, dp = 0, pp = 0, embedding = 0, ep = 0;  // bytes per step
  double params = 0;  // parameters on this rank (the P above)
  double expert_params = 0;  // of them, routed experts (their replicas: dp x cp, not x ep)
};

// For the rank at pipeline position `pp_rank` holding layers `chunks[c]` in
// each of its chunks (c = 0..v-1). `remote_rows`: the rows one MoE dispatch
// moves to and from other ep ranks (measured: MoeLayer::exchanges()); < 0: uniform routing.
RankTraffic rank_traffic(const ModelSpec& m, const Strategy& s, int pp_rank, const std::vector<StageRange>& chunks,
                         double remote_rows = -1);

}  // namespace meshtrain::plan
