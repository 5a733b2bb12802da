// Data-parallel (and ZeRO) communication of one training step on one rank:
// what is sent, when, and how much of it the step waits for. Per group of n
// ranks holding P of this rank's parameters, gradients reduced in gb bytes and
// parameters gathered in pb bytes (ring(n) = (n - 1) / n):
//   ZeRO-0  all-reduce 2 ring(n) P gb once, with the last micro-batch's backward
//           (DDP's no_sync before it; Megatron-LM's DDP)
//   ZeRO-1  reduce-scatter ring(n) P gb once (as ZeRO-0), all-gather ring(n) P pb
//           of the updated parameters after the optimizer
//   ZeRO-2  the reduce-scatter in every micro-batch's backward (DeepSpeed stage 2,
//           meshtrain's ZeRO-2), the all-gather after the optimizer
//   ZeRO-3  every micro-batch: all-gather before its forward and again before
//           its backward, reduce-scatter in its backward (DeepSpeed stage 3,
//           FSDP; meshtrain's ZeRO-3)
//   HSDP    + 2 ring(R) P/n gb across the R replicas with each reduce-scatter
// What hides (TimeOptions): with dp_overlap, bucketed reductions run under their
// micro-batch's backward (2/3 of its compute) and ZeRO-3's prefetched gathers
// under its forward (1/3) and backward; the ZeRO-1/2 all-gather after the
// optimizer is on the step's path unless param_gather_overlap (Megatron-LM's
// --overlap-param-gather: under the next step's first forward). A hidden
// collective still costs its link's processor_usage share (op_time.h).
#pragma once

#include "meshtrain/plan/hardware.h"
#include "meshtrain/plan/step_time.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

// The backward's share of a micro-batch's compute (twice the forward's FLOPs): the window gradient
// reductions and copies hide under; the forward has the rest.
constexpr double kBackwardShare = 2.0 / 3.0;

struct DpTime {
  double bytes = 0;    // sent per rank per step
  double seconds = 0;  // on the wire
  double exposed = 0;  // of those, what the step waits for (+ the slowdown of what it hides under)
};

// `dense`: parameters reduced over dp x cp x ep (ZeRO's shard group x cp x ep); `experts`: routed experts'
// parameters, reduced over dp x cp. `microbatch_compute`: one micro-batch's compute on this rank. `units`:
// the layers on this rank, ZeRO-3's gather units (each gather and reduce-scatter pays its ring's latency once
// per unit; the other stages' collectives are one bucketed stream, whose latency is paid once).
DpTime dp_time(const Strategy& s, double dense, double experts, double gb, double pb, double microbatch_compute,
               double units, const LinkSpec& link, const TimeOptions& o);

}  // namespace meshtrain::plan
