// Communication a step did not hide, per mesh axis: the seconds this rank spent
// blocked in each axis's collectives (Comm::blocked_seconds), beside the step's
// time. On CPU (Gloo, shared memory) a collective completes on host threads, so
// blocked time is exposed time: a synchronous one (tp's all-reduce in the
// forward) is exposed whole; an asynchronous one (DDP's buckets, overlapped with
// the backward) only for the part its wait() still waits. With NCCL the host
// returns before the device finishes: there it is a lower bound (CUDA events are
// the device's measure). pp's includes waiting for the neighbour stage: the bubble.
#pragma once

#include <map>
#include <string>

namespace meshtrain {

// "exposed communication: tp 0.012 s (8.1%), dp 0.004 s (2.7%) of the step's 0.148 s";
// "" when no axis blocked (one rank).
std::string exposed_comm_text(const std::map<std::string, double>& exposed_s, double step_s);

}  // namespace meshtrain
