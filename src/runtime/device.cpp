#include "meshtrain/runtime/device.h"

#include <c10/core/DeviceType.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain {

DeviceRequest parse_device(const std::string& s) {
  if (s == "cpu") return DeviceRequest::Cpu;
  if (s == "cuda") return DeviceRequest::Cuda;
  if (s == "auto") return DeviceRequest::Auto;
  throw std::invalid_argument(fmt::format("device '{}' unknown; use cpu, cuda or auto", s));
}

const char* to_string(DeviceKind d) { return d == DeviceKind::Cuda ? "cuda" : "cpu"; }

// c10::cuda::device_count() answers 0 (and warns once) where the driver is missing.
int cuda_device_count() { return static_cast<int>(c10::cuda::device_count()); }

DeviceKind resolve_device(DeviceRequest request, int devices, int ranks_per_node) {
  if (request == DeviceRequest::Cpu) return DeviceKind::Cpu;
  if (request == DeviceRequest::Auto && (devices == 0 || !kTrainsOnCuda)) return DeviceKind::Cpu;
  if (devices == 0) {
    throw std::invalid_argument(
        "train.device = \"cuda\" but this machine has no CUDA device (no GPU or no driver); use "
        "train.device = \"cpu\" (or \"auto\": cuda where a device is, else cpu)");
  }
  if (ranks_per_node > devices) {
    throw std::invalid_argument(fmt::format(
        "train.device = \"cuda\": {} ranks per node but this node has {} CUDA device{}; each rank needs its own "
        "(NCCL refuses two ranks on one device): start at most {} ranks per node (parallel.nproc, "
        "--nproc-per-node), or use train.device = \"cpu\"",
        ranks_per_node, devices, devices == 1 ? "" : "s", devices));
  }
  if (!kTrainsOnCuda) {
    throw std::invalid_argument(
        "train.device = \"cuda\": this meshtrain build links CUDA and NCCL but its trainer does not place the "
        "model, optimizer and batches on CUDA devices yet; use train.device = \"cpu\" (or \"auto\")");
  }
  return DeviceKind::Cuda;
}

}  // namespace meshtrain
