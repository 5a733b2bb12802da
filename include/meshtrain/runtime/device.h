// The device a run computes on, chosen once in the launching process and checked there:
// train.device = "cpu" | "cuda" | "auto" (cuda when this machine has a CUDA device, else cpu).
//
// Invariants: a CUDA run binds rank r of a node to cuda:LOCAL_RANK, one device per rank
// (NCCL refuses two ranks on one device), so a node may start at most as many ranks as it
// has devices; a run that asks for cuda where there is none fails before any rank starts.
#pragma once

#include <string>

namespace meshtrain {

enum class DeviceKind { Cpu, Cuda };

// Whether the trainer places its tensors on CUDA devices yet. Until it does, "auto" means
// cpu everywhere and "cuda" is refused by name where a device is present.
constexpr bool kTrainsOnCuda = false;

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
DeviceKind resolve_device(DeviceRequest request, int devices, int ranks_per_node);

}  // namespace meshtrain
