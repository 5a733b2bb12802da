// Communication per mesh axis, step time and MFU of a strategy.
//
// Volumes are bytes each rank sends per optimizer step (nccl-tests bus factors:
// all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n):
//   tp  4 collectives of b.s.h per layer per micro-batch (2 forward, 2 backward;
//       the same volume as all-gather + reduce-scatter with sequence parallel)
//   cp  ring attention: K and V (2.b.s.g.d) pass c-1 hops forward, twice that backward
//   ep  4 all-to-alls of b.s.k.h per MoE layer per micro-batch
//   pp  one b.s.h activation forward and one gradient backward per micro-batch (x v)
//   dp  DDP all-reduce of fp32 gradients; ZeRO-1 reduce-scatter fp32 grads + all-gather 16-bit params;
//       ZeRO-2 the reduce-scatter every micro-batch; ZeRO-3 all-gather twice + reduce-scatter every
//       micro-batch (plan/dp_time.h, with when each runs)
// Time (plan/step_time.h, plan/op_time.h): each stage's layers, operation by
// operation, per micro-batch; the slowest stage sets the pace: step = m x
// (slowest stage's micro-batch) + the schedule's bubble over the mean stage +
// pipeline sends + dp traffic not hidden under compute + the optimizer.
// MFU after PaLM (model FLOPs / (time x GPUs x peak)).
#pragma once

#include <map>
#include <string>

#include "meshtrain/plan/count.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/step_time.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

struct AxisTraffic {
  double bytes = 0;      // sent per rank per step
  bool inter_node = false;
  double seconds = 0;  // on the wire
  double exposed = 0;  // of those, on the step's critical path (not under compute), + the compute's slowdown
};

struct EstimateOptions {
  AttnFlops attn = AttnFlops::Full;  // the MFU's FLOPs convention
  TimeOptions time;
};

struct StepEstimate {
  std::map<std::string, AxisTraffic> traffic;  // tp, cp, ep, pp, dp
  double model_flops = 0;   // per step, whole job
  double hardware_flops = 0;  // with recomputation
  Work microbatch;  // one micro-batch through the slowest stage, by kind of work
  double compute_s = 0, bubble_fraction = 0, bubble_s = 0, exposed_comm_s = 0, optimizer_s = 0, step_s = 0;
  OffloadTime offload;  // with optimizer offload: its parts (optimizer_s is then the exposed part of them)
  double tokens_per_s = 0, mfu = 0;
};

// Whether an axis's groups span nodes under the mesh order tp, cp, ep, dp, pp.
bool axis_crosses_nodes(const Strategy& s, const std::string& axis, int per_node);
// How many members of one of the axis's groups share a node (1 when its stride spans a node).
int axis_members_per_node(const Strategy& s, const std::string& axis, int per_node);

StepEstimate estimate_step(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, const EstimateOptions& o = {});

// Fraction of the ideal step the schedule idles: (p-1)/m (GPipe, 1F1B),
// (p-1)/(v m) (interleaved), (p-1)/(3m) (ZB-H1 with T_F = T_B = T_W).
double bubble_fraction(const Strategy& s);

}  // namespace meshtrain::plan
