// Times the outermost Comm call on this thread into its group's blocked seconds
// (comm.h's Comm::blocked_seconds): an op built of other ops, or a wait inside an
// op, counts once.
#pragma once

#include <chrono>

namespace meshtrain {

class BlockedTimer {
 public:
  explicit BlockedTimer(double* seconds) : acc_(depth_++ == 0 ? seconds : nullptr) {
    if (acc_) t0_ = std::chrono::steady_clock::now();
  }
  ~BlockedTimer() {
    --depth_;
    if (acc_) *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  static inline thread_local int depth_ = 0;
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace meshtrain
