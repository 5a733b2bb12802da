// Communication a step did not hide, per mesh axis: the seconds this rank spent
// blocked in each axis's collectives (Comm::blocked_seconds), beside the step's
// time and the planner's estimate of the same (plan/estimate.h: AxisTraffic::
// exposed, the part of an axis's wire time on the step's critical path). On CPU
// (Gloo, shared memory) a collective completes on host threads, so blocked time
// is exposed time: a synchronous one (tp's all-reduce in the forward) is exposed
// whole; an asynchronous one (DDP's buckets, overlapped with the backward) only
// for the part its wait() still waits. With NCCL the host returns before the
// device finishes: there it is a lower bound (CUDA events are the device's
// measure). pp's includes waiting for the neighbour stage: the bubble.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "meshtrain/plan/hardware.h"

namespace meshtrain {

struct TrainConfig;

// "exposed communication: tp 0.012 s (8.1%; plan 0.010 s), dp 0.004 s (2.7%; plan 0.003 s) of the
// step's 0.148 s"; an axis the plan has no entry for gets no "plan"; "" when no axis blocked (one rank).
std::string exposed_comm_text(const std::map<std::string, double>& exposed_s, double step_s,
                              const std::map<std::string, double>& planned_s = {});

// The device the planner models this run on: on cpu this host, measured (plan::cpu_device: the GEMM
// rate the MFU divides by and the copy bandwidth, both of all cores, shared by `ranks_per_host`); on
// cuda the planner's preset whose name the device's contains ("NVIDIA H200": h200); none otherwise.
std::optional<plan::GpuSpec> run_device_spec(bool cuda, const std::string& device_name, double host_gemm_flops,
                                             double host_copy_bw, int ranks_per_host);

// The planner's exposed seconds per axis of one step of this run with `dp` data-parallel replicas on
// `device` (the axes of size 1 have none).
std::map<std::string, double> planned_exposed(const TrainConfig& c, int dp, const plan::GpuSpec& device);

}  // namespace meshtrain
