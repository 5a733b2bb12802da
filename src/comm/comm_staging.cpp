// Comm's staging (comm.h's invariant): a tensor on the other side of the group's backend
// travels through a copy on its side, written back when the call completes.
#include <ATen/Functions.h>

#include "meshtrain/comm/comm.h"
#include "platform/cuda_api.h"

namespace meshtrain {

std::optional<c10::Device> Comm::staging(const at::Tensor& t) const {
  if (size() == 1 || !t.defined()) return std::nullopt;
  if (kind_ == BackendKind::Gloo && t.is_cuda()) return c10::Device(c10::DeviceType::CPU);
  if (kind_ == BackendKind::Nccl && t.is_cpu()) return c10::Device(c10::DeviceType::CUDA, loaded_cuda_api()->current_device());
  return std::nullopt;
}

CommWork Comm::followed(CommWork w, std::function<void()> then) {
  if (w.done_) {
    then();
    return w;
  }
  w.finish_ = [first = std::move(w.finish_), then = std::move(then)]() {
    if (first) first();
    then();
  };
  return w;
}

}  // namespace meshtrain
