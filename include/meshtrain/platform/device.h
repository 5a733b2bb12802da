// The device a run computes on, chosen once in the launching process and checked there:
// train.device = "cpu" | "cuda" | "auto" (cuda when this machine has a CUDA device, else cpu).
//
// Invariants: a CUDA run binds rank r of a node to cuda:LOCAL_RANK, one device per rank
// (NCCL refuses two ranks on one device), so a node may start at most as many ranks as it
// has devices; a run that asks for cuda where there is none fails before any rank starts.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace meshtrain {

enum class DeviceKind { Cpu, Cuda };

// Whether the trainer places its tensors on CUDA devices ("auto" picks cuda where one is).
constexpr bool kTrainsOnCuda = true;

// "cpu" | "cuda" | "auto"; std::invalid_argument naming the value otherwise.
// Parsing only: nothing is probed.
enum class DeviceRequest { Cpu, Cuda, Auto };
DeviceRequest parse_device(const std::string& s);
const char* to_string(DeviceKind d);

// CUDA devices this process can see (0 without a GPU or driver: the CUDA build still loads).
int cuda_device_count();

// The device for `request` given `devices` visible CUDA devices and `ranks_per_node` ranks
// started on each node. Throws std::invalid_argument with one message naming the value and
// the fix: cuda without a device; more ranks on a node than devices; cuda while the trainer
// cannot place tensors there (kTrainsOnCuda).
// `share`: the ranks' collectives go over Gloo (through host memory), so ranks may share
// a device (rank r of a node on cuda:(r mod devices)).
DeviceKind resolve_device(DeviceRequest request, int devices, int ranks_per_node, bool share = false);

// The device this process computes on: cpu until bind_compute_device. A CUDA rank binds
// cuda:LOCAL_RANK (mod the node's devices when they are shared) once, before it builds anything: parameters (ParamStore), optimizer
// state, DDP buckets, ZeRO flats and batches are made on compute_device(), and every
// CUDA call of the process uses it as its current device.
void bind_compute_device(DeviceKind kind, int local_rank);
c10::Device compute_device();
inline bool computes_on_cuda() { return compute_device().is_cuda(); }

// Waits for the compute device's queued work (a no-op on cpu): for timers and tests.
void synchronize_compute_device();

// The CUDA caching allocator's peak of bytes allocated on the compute device since the
// process started or the last reset (0 on cpu), and the reset.
int64_t peak_device_bytes();
void reset_peak_device_bytes();

// The compute device's name ("cpu", or the CUDA device's, e.g. "NVIDIA H200").
std::string compute_device_name();

}  // namespace meshtrain
