// The table of CUDA entry points that libmeshtrain_cuda.so (src/cuda/plugin.cpp) hands to
// the core (platform/cuda_loader.h). The core links libtorch_cpu only; everything that needs
// libtorch_cuda, c10_cuda, the CUDA runtime or NCCL lives behind this table, so a process
// that never computes on a GPU never loads them (on this wheel: ~235 MiB resident per
// process, and their start-up time).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "meshtrain/compat.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace meshtrain {

// Bumped whenever the table changes: a plugin from another build is refused by name.
constexpr int kCudaApiVersion = 1;

struct CudaApi {
  int version;
  int (*device_count)();
  void (*set_device)(int index);
  int (*current_device)();
  void (*synchronize)();
  int64_t (*peak_allocated_bytes)(int index);
  void (*reset_peak)(int index);
  std::string (*device_name)(int index);
  c10::intrusive_ptr<PGBackend> (*make_nccl)(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout);
};

}  // namespace meshtrain

// The plugin's one exported symbol.
extern "C" const meshtrain::CudaApi* meshtrain_cuda_api();

namespace meshtrain {
// The loaded plugin's table, or nullptr where none is loaded (platform/cuda_loader.h says when).
const CudaApi* loaded_cuda_api();
}  // namespace meshtrain
