// The time of one micro-batch through a layer, the embedding and the output
// layer on one rank, by kind of work (plan/estimate.h assembles the step).
//
// Each layer is its list of operations, forward and backward (and the
// recomputed forward), timed by plan/op_time.h:
//   GEMMs      q k v, o, the FFN's (a MoE layer: its experts' GEMMs at the rows each expert receives), forward
//              x W, backward dX = dY W^T and dW = X^T dY, each with its own shape;
//   attention  materialised: Q K^T and P V as per-head batched GEMMs (backward: four), plus the softmax and
//              dropout over the scores as streaming passes; flash: the FLOPs (causal: half the square) at the
//              kernel's measured rate for the rank's sequence and head dimension (flash_rate), backward 2.5x
//              the forward (FlashAttention-2's 5 vs 2 matmuls);
//   streaming  norms, bias + dropout + residual adds, the activation, RoPE: bytes read and written, backward
//              twice the forward's;
//   tp         no SP: 2 all-reduces forward, 2 backward; SP: 2 all-gathers + 2 reduce-scatters forward, as
//              many backward plus the all-gathers Megatron repeats for the weight gradients (Korthikanti et
//              al. sec. 4.2.2). Backward collectives of the column-parallel linears overlap their GEMMs
//              (Megatron's asynchronous tp communication) unless TimeOptions says otherwise; a hidden
//              collective still slows the GEMMs under it (LinkSpec::processor_usage, plan/op_time.h);
//   cp         ring: K and V blocks pass c-1 hops, each hidden behind one block of attention; Ulysses: 4
//              all-to-alls each way; all-gather: K and V gathered, their gradients reduce-scattered;
//   ep         dispatch and combine all-to-alls, forward and backward.
// Recomputation adds the forward again: the attention core (selective) or everything (full, with its tp
// communication).
#pragma once

#include "meshtrain/plan/hardware.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

struct TimeOptions {
  // Backward tp collectives of the column-parallel linears run under their GEMMs (Megatron-LM's asynchronous
  // tensor-parallel all-reduce, ColumnParallelLinearWithAsyncAllreduce, since September 2021).
  bool tp_overlap_backward = true;
  // Every tp collective runs under a GEMM (Transformer Engine's userbuffers, --tp-comm-overlap).
  bool tp_overlap = false;
  // Gradient buckets are reduced during the backward (DDP, FSDP, Megatron's --overlap-grad-reduce) and ZeRO-3
  // gathers prefetched under compute; off in the Megatron-LM runs of 2021-22.
  bool dp_overlap = true;
  // ZeRO-1/2's all-gather of the updated parameters runs under the next step's first forward (Megatron-LM's
  // --overlap-param-gather); off: after the optimizer, on the step's path (DeepSpeed, meshtrain).
  bool param_gather_overlap = false;
  // Pipeline sends carry 1/tp of the activation and all-gather it inside the node (Narayanan et al. 2021,
  // sec. 4.1).
  bool pp_scatter_gather = true;
  // The weight-gradient GEMMs accumulate straight into the gradient buffer (Megatron-LM's
  // --gradient-accumulation-fusion, APEX fused_weight_gradient_mlp_cuda, since February 2022). Off: each further
  // micro-batch's gradients are added into it in a pass of their own (read both, write one: Megatron-LM of
  // early 2021, its main_grad.add_ hook, or autograd accumulating into .grad).
  bool grad_accumulation_fusion = true;
  // Gradients are accumulated and reduced in fp32 (meshtrain, DESIGN.md; Megatron-LM's
  // --accumulate-allreduce-grads-in-fp32 and its 18-byte precision). Off: in the 16-bit gradients' own dtype
  // where the precision has them (Megatron-LM's fp16 default of 2021).
  bool fp32_grad_reduce = true;
  // The elementwise ops run as eager PyTorch runs a Llama written op by op (torchtitan's model of 2024-12 without
  // torch.compile): each norm, rotary embedding, GQA key/value expansion, activation and residual add its own
  // passes over memory (layer_work counts them). Off: fused kernels (Megatron-LM, Transformer Engine, compile).
  bool eager_elementwise = false;
};

// Seconds by kind of work.
struct Work {
  double gemm = 0, attention = 0, memory = 0;  // compute
  double tp = 0, cp = 0, ep = 0;               // exposed communication (+ the slowdown of what it hides under)
  double tp_wire = 0, cp_wire = 0, ep_wire = 0;  // the same collectives' whole time, hidden or not
  double compute() const { return gemm + attention + memory; }
  double comm() const { return tp + cp + ep; }
  double total() const { return compute() + comm(); }
  Work& operator+=(const Work& w);
  Work operator*(double k) const;
};

// One micro-batch through one layer (forward, backward, recomputation) on one rank.
Work layer_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, bool moe_layer, const TimeOptions& o = {});
// The first stage's embedding (lookup, tp reduction) and the last stage's final norm, logits and
// cross-entropy, forward and backward.
Work embedding_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu);
Work output_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, int64_t vocab_padded);
// The optimizer step on a rank holding `params` parameters of which it updates `shard` (its ZeRO shard; all
// of them without ZeRO): AdamW reading and writing the precision's states over the shard, gradient zeroing
// and the norm for clipping over the gradients it holds.
double optimizer_seconds(double params, double shard, const Strategy& s, const GpuSpec& gpu);
// Optimizer offload (ZeRO-Offload, Ren et al., USENIX ATC'21, arXiv 2101.06840) as DeepSpeed's ZeRO-1/2 run
// it (deepspeed/runtime/zero/stage_1_and_2.py, copy_grads_in_partition), for each rank's shard:
//   gradients  in each micro-batch's backward: with accumulation, the 16-bit gradients so far come up from a
//              host buffer (from the second micro-batch on), are added to and go back down; in the last one
//              they also go down in fp32 (cast on the GPU) into the optimizer's partition;
//   Adam       on the host (DeepSpeedCPUAdam: reads fp32 weight, gradient, m and v, writes weight, m and v),
//              then the weights cast into a 16-bit pinned buffer (read 4, write 2), its DRAM shared by the
//              node's ranks;
//   weights    copied up before the parameters' all-gather.
// The copies hide under their micro-batch's backward (`backward` seconds) when `overlapped`.
struct OffloadTime {
  double copies = 0, copies_exposed = 0;  // gradient copies of the whole step, and the part not hidden
  double host_adam = 0, params_up = 0;
  double exposed() const { return copies_exposed + host_adam + params_up; }
};
OffloadTime offload_time(double shard_params, const Strategy& s, const GpuSpec& gpu, double backward, bool overlapped);
// The link an axis's groups use: inside a node or across (mesh order tp, cp, ep, dp, pp); across nodes, with
// as many rails as the group has members in one node.
LinkSpec axis_link(const Strategy& s, const std::string& axis, const GpuSpec& gpu);

}  // namespace meshtrain::plan
