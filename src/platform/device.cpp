#include "meshtrain/platform/device.h"

#include <c10/core/DeviceType.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/platform/cuda_loader.h"
#include "platform/cuda_api.h"

namespace meshtrain {

DeviceRequest parse_device(const std::string& s) {
  if (s == "cpu") return DeviceRequest::Cpu;
  if (s == "cuda") return DeviceRequest::Cuda;
  if (s == "auto") return DeviceRequest::Auto;
  throw std::invalid_argument(fmt::format("device '{}' unknown; use cpu, cuda or auto", s));
}

const char* to_string(DeviceKind d) { return d == DeviceKind::Cuda ? "cuda" : "cpu"; }

// 0 where the CUDA plugin is not loaded (no driver: platform/cuda_loader.h).
int cuda_device_count() {
  const CudaApi* cuda = loaded_cuda_api();
  return cuda ? cuda->device_count() : 0;
}

DeviceKind resolve_device(DeviceRequest request, int devices, int ranks_per_node, bool share) {
  if (request == DeviceRequest::Cpu) return DeviceKind::Cpu;
  if (request == DeviceRequest::Auto && (devices == 0 || !kTrainsOnCuda)) return DeviceKind::Cpu;
  if (devices == 0) {
    throw std::invalid_argument(
        fmt::format("train.device = \"cuda\" but this machine has no CUDA device ({}); use "
                    "train.device = \"cpu\" (or \"auto\": cuda where a device is, else cpu)",
                    cuda_loaded() ? "the driver sees no GPU" : cuda_absence_reason()));
  }
  if (ranks_per_node > devices && !share) {
    throw std::invalid_argument(fmt::format(
        "train.device = \"cuda\": {} ranks per node but this node has {} CUDA device{}; each rank needs its own "
        "(NCCL refuses two ranks on one device): start at most {} ranks per node (parallel.nproc, "
        "--nproc-per-node), set comm.backend = \"gloo\" to share devices, or use train.device = \"cpu\"",
        ranks_per_node, devices, devices == 1 ? "" : "s", devices));
  }
  if (!kTrainsOnCuda) {
    throw std::invalid_argument(
        "train.device = \"cuda\": this meshtrain build links CUDA and NCCL but its trainer does not place the "
        "model, optimizer and batches on CUDA devices yet; use train.device = \"cpu\" (or \"auto\")");
  }
  return DeviceKind::Cuda;
}

namespace {
c10::Device g_device(c10::DeviceType::CPU);
}  // namespace

void bind_compute_device(DeviceKind kind, int local_rank) {
  if (kind == DeviceKind::Cpu) {
    g_device = c10::Device(c10::DeviceType::CPU);
    return;
  }
  const int devices = cuda_device_count();
  if (devices == 0 || local_rank < 0) {
    throw std::invalid_argument(fmt::format("local rank {}: this process sees no CUDA device", local_rank));
  }
  const auto index = static_cast<c10::DeviceIndex>(local_rank % devices);
  loaded_cuda_api()->set_device(index);
  g_device = c10::Device(c10::DeviceType::CUDA, index);
}

c10::Device compute_device() { return g_device; }

void synchronize_compute_device() {
  if (g_device.is_cuda()) loaded_cuda_api()->synchronize();
}

int64_t peak_device_bytes() {
  if (!g_device.is_cuda()) return 0;
  return loaded_cuda_api()->peak_allocated_bytes(g_device.index());
}

void reset_peak_device_bytes() {
  if (g_device.is_cuda()) loaded_cuda_api()->reset_peak(g_device.index());
}

std::string compute_device_name() {
  if (!g_device.is_cuda()) return "cpu";
  return loaded_cuda_api()->device_name(g_device.index());
}

}  // namespace meshtrain
