// libmeshtrain_cuda.so: the CUDA half of meshtrain, loaded on demand (platform/cuda_loader.h).
// Loading it loads libtorch_cuda (whose static initialisers register ATen's CUDA kernels and
// hooks), c10_cuda, the CUDA runtime and NCCL.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "platform/cuda_api.h"

namespace {

int device_count() { return static_cast<int>(c10::cuda::device_count()); }  // 0 (with a warning) without a driver
void set_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
int current_device() { return c10::cuda::current_device(); }
void synchronize() { c10::cuda::device_synchronize(); }

int64_t peak_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void reset_peak(int index) { c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index)); }

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "cuda";
  return prop.name;
}

c10::intrusive_ptr<meshtrain::PGBackend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   std::chrono::milliseconds timeout) {
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
}

const meshtrain::CudaApi kApi{meshtrain::kCudaApiVersion, &device_count, &set_device, &current_device, &synchronize,
                              &peak_allocated_bytes, &reset_peak, &device_name, &make_nccl};

}  // namespace

extern "C" __attribute__((visibility("default"))) const meshtrain::CudaApi* meshtrain_cuda_api() { return &kApi; }
