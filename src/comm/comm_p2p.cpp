// Comm's point-to-point calls (pipeline stages' activations and gradients) and its barrier.
#include "meshtrain/comm/comm.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/backend.h"
#include "comm/blocked_timer.h"
#include "comm/checks.h"
#include "meshtrain/comm/flight_recorder.h"

namespace meshtrain {

CommWork Comm::isend(const at::Tensor& t, int dst, int tag) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("send", t);
  if (dst < 0 || dst >= size() || dst == index_) {
    throw std::invalid_argument(fmt::format("send on group '{}': destination {} is not another rank of 0..{}",
                                            name_, dst, size() - 1));
  }
  if (tag < 0 || tag >= kRingTagBase) throw std::invalid_argument(fmt::format("send: tag {} outside [0, 2^20)", tag));
  if (const auto d = staging(t)) return isend(t.to(*d), dst, tag);  // the work holds the copy
  count("send", t, 1.0);
  begin(CallKind::Send, t, dst);
  CommWork w = make_work("send", t);
  std::vector<at::Tensor> v{as_transport(t, native_bf16())};
  w.works_.push_back(pg_->send(v, dst, tag));
  moved("send", dst, t.numel() * t.element_size());
  return w;
}

CommWork Comm::irecv(const at::Tensor& t, int src, int tag) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("recv", t);
  if (src < 0 || src >= size() || src == index_) {
    throw std::invalid_argument(fmt::format("recv on group '{}': source {} is not another rank of 0..{}",
                                            name_, src, size() - 1));
  }
  if (tag < 0 || tag >= kRingTagBase) throw std::invalid_argument(fmt::format("recv: tag {} outside [0, 2^20)", tag));
  if (const auto d = staging(t)) {
    at::Tensor s = at::empty(t.sizes(), t.options().device(*d));
    return followed(irecv(s, src, tag), [t, s]() { t.copy_(s); });
  }
  count("recv", t, 1.0);
  begin(CallKind::Recv, t, src);
  CommWork w = make_work("recv", t);
  std::vector<at::Tensor> v{as_transport(t, native_bf16())};
  w.works_.push_back(pg_->recv(v, src, tag));
  return w;
}

void Comm::barrier() {
  BlockedTimer timer(&blocked_s_);
  stats_["barrier"].calls += 1;
  begin(CallKind::Barrier, at::Tensor());
  if (size() == 1) return;
  CommWork w;
  w.what_ = fmt::format("barrier on group '{}' at sequence {}", name_, seq_);
  w.done_ = false;
  w.flight_ = FlightRecorder::instance().start(flight_group_, call_);
  agree_native(w);
  w.works_.push_back(pg_->barrier());
  w.wait();
}

}  // namespace meshtrain
