// A call's life in Comm: numbering it and describing it (call.h), the
// agreement check over Gloo, the CommWork that completes it, and its entry in
// the flight recorder (flight_recorder.h).
#include <ATen/Functions.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <iostream>

#include "comm/backend.h"
#include "meshtrain/comm/comm.h"
#include "comm/blocked_timer.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/platform/crash_point.h"

namespace meshtrain {

// ---------------------------------------------------------------- CommWork

CommWork::CommWork() = default;

CommWork::CommWork(CommWork&& o) noexcept
    : works_(std::move(o.works_)),
      finish_(std::move(o.finish_)),
      what_(std::move(o.what_)),
      blocked_(o.blocked_),
      done_(o.done_),
      flight_(o.flight_) {
  o.done_ = true;
  o.flight_ = 0;
}

CommWork& CommWork::operator=(CommWork&& o) noexcept {
  if (this != &o) {
    if (!done_) {
      try { wait(); } catch (const std::exception& e) { std::cerr << "meshtrain: " << e.what() << "\n"; }
    }
    works_ = std::move(o.works_);
    finish_ = std::move(o.finish_);
    what_ = std::move(o.what_);
    blocked_ = o.blocked_;
    done_ = o.done_;
    flight_ = o.flight_;
    o.done_ = true;
    o.flight_ = 0;
  }
  return *this;
}

CommWork::~CommWork() {
  if (done_) {
    settle(CallState::Completed);
    return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "meshtrain: a collective that was never waited on failed: " << e.what() << "\n";
  }
}

void CommWork::wait() {
  BlockedTimer timer(blocked_);
  if (done_) {
    settle(CallState::Completed);
    return;
  }
  done_ = true;  // a failed group is poisoned (PLATFORM.md): never wait twice
  try {
    for (auto& w : works_) w->wait();
    works_.clear();
    if (finish_) finish_();
  } catch (const std::exception& e) {
    const std::string msg = fmt::format(
        "{} did not complete: {}\n  A timeout usually means another rank of this group did not make "
        "the same call; compare the sequence numbers the ranks report.",
        what_, e.what());
    fail(msg);
    throw CommError(msg);
  }
  settle(CallState::Completed);
}

void CommWork::settle(CallState state) {
  if (flight_ == 0) return;
  FlightRecorder::instance().end(flight_, state);
  flight_ = 0;
}

void CommWork::fail(const std::string& why) {
  done_ = true;
  settle(CallState::Failed);
  FlightRecorder::instance().dump("failure: " + why);
}

void Comm::run_sync(CommWork& w, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    w.fail(e.what());
    throw;
  }
  w.done_ = true;
  w.settle(CallState::Completed);
}


void Comm::begin(CallKind kind, const at::Tensor& t, int root, ReduceOp* reduce) {
  const bool p2p = kind == CallKind::Send || kind == CallKind::Recv;
  call_.seq = p2p ? ++p2p_seq_ : ++seq_;
  call_.kind = kind;
  call_.dtype = t.defined() ? static_cast<int32_t>(t.scalar_type()) : -1;
  call_.numel = t.defined() ? t.numel() : 0;
  call_.root = root;
  call_.reduce = reduce ? static_cast<int32_t>(*reduce) : -1;
}

void Comm::agree_native(CommWork& w) {
  if (kind_ != BackendKind::Gloo || size() < 2 || check_every_ <= 0 || call_.seq % check_every_ != 0) return;
  const CallDesc& c = call_;
  // Row r holds rank r's call, zeros elsewhere: one small sum gathers them (Gloo has no all_gather_base).
  at::Tensor all = at::zeros({size(), 6}, at::kLong);
  auto mine = all.accessor<int64_t, 2>()[index_];
  mine[0] = static_cast<int64_t>(c.seq);
  mine[1] = static_cast<int64_t>(c.kind);
  mine[2] = c.dtype;
  mine[3] = c.numel;
  mine[4] = c.root;
  mine[5] = c.reduce;
  std::vector<at::Tensor> v{all};
  try {
    pg_->allreduce(v)->wait();
    moved_by_gloo_ring("agreement check", v[0]);
  } catch (const std::exception& e) {
    const std::string msg = fmt::format("{} (its agreement check) did not complete: {}", w.what_, e.what());
    w.fail(msg);
    throw CommError(msg);
  }
  auto a = all.accessor<int64_t, 2>();
  for (int r = 0; r < size(); ++r) {
    CallDesc theirs;
    theirs.seq = static_cast<uint64_t>(a[r][0]);
    theirs.kind = static_cast<CallKind>(a[r][1]);
    theirs.dtype = static_cast<int32_t>(a[r][2]);
    theirs.numel = a[r][3];
    theirs.root = static_cast<int32_t>(a[r][4]);
    theirs.reduce = static_cast<int32_t>(a[r][5]);
    if (theirs != c) {
      const std::string msg = disagreement(w.what_, name_, index_, c, r, theirs);
      w.fail(msg);
      throw CommError(msg);
    }
  }
}

void Comm::count(const char* op, const at::Tensor& sized, double bus_factor) {
  OpStats& s = stats_[op];
  const uint64_t bytes = sized.numel() * sized.element_size();
  s.calls += 1;
  s.bytes += bytes;
  s.wire_bytes += static_cast<uint64_t>(bytes * bus_factor + 0.5);
}

void Comm::moved(const char* op, int peer, int64_t bytes) {
  OpStats& s = stats_[op];
  s.moved_bytes += static_cast<uint64_t>(bytes);
  s.peers[peer] += static_cast<uint64_t>(bytes);
}

void Comm::moved_by_gloo_ring(const char* op, const at::Tensor& t) {
  const int n = size();
  if (n > 1) moved(op, (index_ + 1) % n, 2 * (n - 1) * (t.numel() * t.element_size()) / n);
}

CommWork Comm::make_work(const char* op, const at::Tensor& t) const {
  CommWork w;
  w.what_ = describe(op, t);
  w.blocked_ = &blocked_s_;
  w.done_ = false;
  if (size() > 1) {
    crash_point("comm.call");  // tests: a rank that stops or dies before its k-th call
    w.flight_ = FlightRecorder::instance().start(flight_group_, call_);
  }
  return w;
}
}  // namespace meshtrain
