#include "comm/backend.h"

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include "meshtrain/platform/cuda_loader.h"
#include "platform/cuda_api.h"

namespace meshtrain {

c10::intrusive_ptr<c10d::Work> backend_all_gather_base(PGBackend& pg, at::Tensor& out, at::Tensor& in) {
  return pg._allgather_base(out, in);
}

c10::intrusive_ptr<c10d::Work> backend_reduce_scatter_base(PGBackend& pg, at::Tensor& out, at::Tensor& in,
                                                           bool max) {
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = max ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
  return pg._reduce_scatter_base(out, in, opts);
}

bool backend_available(BackendKind kind) {
#ifdef USE_C10D_GLOO
  if (kind == BackendKind::Gloo) return true;
#endif
  // NCCL lives in the CUDA plugin (platform/cuda_loader.h): loaded where a driver is.
  if (kind == BackendKind::Nccl) return loaded_cuda_api() != nullptr;
  return false;
}

c10::intrusive_ptr<PGBackend> make_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           const BackendOptions& opts) {
  if (opts.kind == BackendKind::Gloo) {
#ifdef USE_C10D_GLOO
    auto o = c10d::ProcessGroupGloo::Options::create(opts.timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (!opts.host.empty()) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(opts.host));
    } else {
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    o->threads = 2;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o);
#endif
  } else if (const CudaApi* cuda = loaded_cuda_api()) {
    return cuda->make_nccl(store, rank, size, opts.timeout);
  } else {
    throw std::invalid_argument(fmt::format("the nccl backend needs CUDA: {}; use the gloo backend",
                                            cuda_absence_reason()));
  }
  throw std::invalid_argument("this meshtrain build has no gloo backend; use --backend nccl");
}

}  // namespace meshtrain
