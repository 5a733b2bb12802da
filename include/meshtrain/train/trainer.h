// A training run: what `meshtrain train` does on each rank, as a library call
// (the binary only parses arguments and starts ranks).
//
// train() builds the mesh (tp x cp x dp x pp) and the engine (train/engine.h),
// resumes from the newest checkpoint when there is one, and runs the steps:
// micro-batches from the loader (each cp rank taking its zig-zag chunks), the
// step, logging (stdout and a JSONL metrics file), evaluation, checkpoints, and
// with --check-plan the planner's bytes held against the runtime's counters.
#pragma once

#include <memory>
#include <string>

#include "meshtrain/compat.h"

#include "meshtrain/plan/strategy.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/train/config.h"

namespace meshtrain {
class Runtime;

// What can be checked from the config and the data before any rank starts
// work, for a job of `world` ranks: the mesh fits the world, the batch divides
// over data-parallel ranks, token ids fit the vocabulary, the training and
// validation shards hold a global batch of windows, --check-plan runs fp32.
// Each failure is one std::invalid_argument naming the value. With
// `warn_memory`, also prints a warning when the planner's per-rank estimate
// times the ranks on this host exceeds its free memory.
// `ranks_per_node`: the ranks started on each node (train.device = cuda needs a device each).
// Returns the device the run computes on (platform/device.h).
DeviceKind check_run(const TrainConfig& c, int world, int ranks_per_node, bool plan_check, bool warn_memory);

// Kernel health at start (train/gemm_peak.h), in the launching process of a CPU run before any
// rank starts: measures the run dtype's GEMM rate on all of this host's cores, prints each
// warning gemm_health() finds (stderr), and hands the rate to the ranks as their MFU
// denominator. Nothing where train.peak_tflops is given.
void measure_host_before_ranks(const TrainConfig& c);

// What a CUDA run computes today (one error naming the feature and the fix otherwise):
// pretraining and SFT of dense models (naive or sdpa attention), data parallelism (DDP,
// ZeRO-1/2/3, HSDP), tensor and sequence parallelism, fp32/bf16/fp16, recomputation,
// checkpoints. MoE, context and pipeline parallelism, the tiled kernel and document masks,
// adapters and the other methods run on cpu only for now.
void check_cuda_run(const TrainConfig& c);

// Binds this rank to the run's device (cuda:LOCAL_RANK, platform/device.h) and returns the
// backend of its collectives (comm.backend; auto: NCCL on cuda, Gloo on cpu). Call before
// the runtime starts: NCCL binds its communicators to the current device.
BackendKind bind_run_device(const TrainConfig& c, int local_rank, int local_world_size);

// Runs the configured training on this process's rank of `rt`. Returns 0.
int train(const TrainConfig& c, Runtime& rt, bool plan_check);

}  // namespace meshtrain
