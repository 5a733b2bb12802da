// CUDA on demand. The meshtrain binaries link libtorch's CPU half only; its CUDA half
// (libtorch_cuda, c10_cuda, the CUDA runtime, cuBLAS, NCCL), with meshtrain's own CUDA code,
// is the plugin libmeshtrain_cuda.so, loaded where a CUDA driver is. A CPU machine never
// maps those libraries: measured on the torch 2.11.0+cu130 wheel, they add ~235 MiB resident
// to every process at load (static initialisers and pages touched), more than a third of
// what an idle rank holds.
//
// Invariant: the plugin loads before any ATen call. ATen looks up its CUDA hooks once, at the
// first query (at::detail::getCUDAHooks()), and a process that queried before libtorch_cuda
// loaded keeps "no CUDA" for its life; load_cuda() checks the hooks it got and throws if so.
#pragma once

#include <string>

namespace meshtrain {

// Loads the plugin if a CUDA driver is present (libcuda.so.1 loads), at most once per
// process. Every main() calls it first; later calls return at once.
void load_cuda_where_a_driver_is();

// Loads the plugin whether or not a driver is present (without one, no device is seen).
// True when loaded; else cuda_absence_reason() says why.
bool load_cuda();

bool cuda_loaded();

// Why the plugin is not loaded ("" when it is): no driver, or the plugin's loader error.
std::string cuda_absence_reason();

}  // namespace meshtrain
