// A parallel strategy and the hardware it runs on: the planner's inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/hardware.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

enum class Recompute { None, Selective, Full };
enum class Schedule { GPipe, OneFOneB, Interleaved, ZBH1 };
// Bytes per parameter (params + grads + optimizer states, Adam):
//   Fp32       4 + 4 + 8  = 16   fp32 weights, fp32 grads, m and v
//   Bf16       2 + 2 + 12 = 16   bf16 weights and grads, fp32 master + m + v (ZeRO paper)
//   Megatron18 2 + 4 + 12 = 18   bf16 weights, fp32 main grads (Megatron-LM's default)
//   Fp8        Bf16 + 1 (a cached fp8 copy of each weight; 2 with Hopper's transpose)
enum class Precision { Fp32, Bf16, Megatron18, Fp8 };
// How context parallelism computes attention over the cp ranks' sequence
// chunks (parallel/context/): K/V blocks passed round a ring (Liu et al.,
// arXiv 2310.01889), an all-to-all from sequence to head shards (Ulysses,
// arXiv 2309.14509), or K/V all-gathered (Llama 3, arXiv 2407.21783 sec. 3.3.2).
enum class CpImpl { Ring, Ulysses, AllGather };

const char* to_string(Recompute r);
const char* to_string(Schedule s);
const char* to_string(Precision p);
const char* to_string(CpImpl c);  // ring | ulysses | allgather
Recompute parse_recompute(const std::string& s);
Schedule parse_schedule(const std::string& s);
Precision parse_precision(const std::string& s);
CpImpl parse_cp_impl(const std::string& s);

struct Strategy {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
  int vpp = 1;          // virtual stages per pipeline rank (interleaved schedule)
  // Layers of each of the pp x vpp stages in order (plan/partition.h); empty: an even split, the first
  // stages taking the rest (Megatron-LM's default).
  std::vector<int64_t> pp_layers;
  CpImpl cp_impl = CpImpl::Ring;
  bool sp = false;      // sequence parallel (with tp > 1)
  int zero = 0;         // 0: DDP; 1, 2; 3 = FSDP full shard
  int dp_shard = 0;     // HSDP: shard within groups of this many dp ranks (0 = all of dp)
  bool offload = false;  // optimizer states (and master weights) in host memory
  bool flash = false;    // attention core never materialised (flash-style kernels)
  // The output layer and cross-entropy fused a chunk of rows at a time (meshtrain's loss,
  // parallel/tensor/fused_cross_entropy.h): the logits never whole; false: Megatron's fp32 logits.
  bool fused_loss = false;
  bool fp8_transpose = false;  // Hopper: fp8 weight copies kept in both layouts
  // Weights held leaner than the ZeRO paper's mixed precision (2 + 2 + 12 bytes a parameter), as NeMo's
  // fine-tuning recipes run: Adam's moments and its copy of the weights in bf16 (Apex's DistributedFusedAdam with
  // dtype = bf16 and store_params: 6 bytes, not 12; no 16-bit precision beyond the weights'), and the blocks'
  // linear weights held in FP8 alone (Transformer Engine's fp8_model_init, NeMo's fp8_params: 1 byte, no 16-bit
  // copy beside the FP8 one). Neither is searched: each trades precision for memory, the user's call.
  bool bf16_optimizer = false;
  bool fp8_params = false;  // precision fp8 only
  Recompute recompute = Recompute::None;
  // With recompute = Selective: torchtitan's per-op selective activation checkpointing
  // (selective_ac_option = "op", torchtitan/models/llama/parallelize_llama.py) instead of
  // Korthikanti et al.'s: each block keeps its input, the outputs of every other matmul in
  // execution order (q, v, w1, w2 of q, k, v, o, w1, w3, w2) and SDPA's, and recomputes the
  // rest (the other matmuls, the elementwise ops) in its backward.
  bool sac_op = false;
  Schedule schedule = Schedule::OneFOneB;
  Precision precision = Precision::Bf16;
  int64_t micro_batch = 1;
  int64_t global_batch = 1;  // samples per optimizer step
  int64_t seq = 0;           // sequence length (0 = the model's)

  int world() const { return tp * cp * ep * dp * pp; }
  int shard_group() const { return dp_shard > 0 ? dp_shard : dp; }
  // Samples are split over dp x ep (expert-parallel ranks see different tokens).
  int64_t microbatches() const { return global_batch / (micro_batch * dp * ep); }
  std::string describe() const;
};

// Checks the strategy against the model (divisibility of heads, layers,
// sequence, batch) and itself; throws std::invalid_argument naming the value
// and the fix.
void validate(const Strategy& s, const ModelSpec& m);
// Strategy::bf16_optimizer and fp8_params against the precision (part of validate; the searches check it first,
// once): throws std::invalid_argument naming the flag and the fix.
void validate_weight_storage(Precision p, bool bf16_optimizer, bool fp8_params);

// The shapes context parallelism needs (part of validate, and checked by the
// training config before any rank starts): the sequence in 2 x cp zig-zag
// chunks (and each rank's share in tp pieces with sequence parallelism);
// Ulysses: each tp rank's heads divisible by cp. Throws std::invalid_argument
// naming the values and the fix.
void validate_context_parallel(const ModelSpec& m, int64_t seq, int cp, int tp, bool sp, CpImpl impl);


}  // namespace meshtrain::plan
