// Internal: the c10d calls whose spelling differs between libtorch versions, and
// construction of a backend (Gloo or NCCL) for one group.
#pragma once

#include <chrono>

#include <ATen/core/Tensor.h>

#include "meshtrain/compat.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace meshtrain {

// Native on NCCL; on Gloo Comm uses its own measured-faster emulations (PLATFORM.md).
c10::intrusive_ptr<c10d::Work> backend_all_gather_base(PGBackend& pg, at::Tensor& out, at::Tensor& in);
c10::intrusive_ptr<c10d::Work> backend_reduce_scatter_base(PGBackend& pg, at::Tensor& out, at::Tensor& in,
                                                           bool max);

struct BackendOptions {
  BackendKind kind = BackendKind::Gloo;
  std::chrono::milliseconds timeout{300000};
  std::string host;  // address this process listens on ("" = resolve the hostname)
};

// Builds one group's backend over `store` (already prefixed for the group).
c10::intrusive_ptr<PGBackend> make_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           const BackendOptions& opts);

bool backend_available(BackendKind kind);

}  // namespace meshtrain
