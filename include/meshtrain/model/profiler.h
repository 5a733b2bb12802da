// Per-segment timing of a transformer step (seed 003, LLM Lab 06): forward time
// of attention (norm + attention + its communication), FFN (norm + MLP + its
// communication) and the rest (embedding, final norm, head, loss), and backward
// time per block.
//
// Backward is timed with identity autograd nodes at each block's input and
// output: the gradient reaches the output marker when the block's backward
// starts and leaves the input marker when it is done (the input marker runs
// only after every path through the block, residual included, delivered its
// gradient). CPU ops are synchronous, so wall-clock time is the op time; a CUDA
// build would need a stream synchronisation at each mark.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain {

class SegmentProfiler {
 public:
  using Clock = std::chrono::steady_clock;

  void reset();
  void add(const std::string& segment, double seconds) { totals_[segment] += seconds; }
  // Identity in forward; in backward records when the gradient passed (block
  // output: the block's backward starts; block input: it ended).
  at::Tensor mark(const at::Tensor& x, int block, bool block_output);
  // Folds the recorded marks into "backward (block i)" totals; call after backward.
  void collect_backward();

  const std::map<std::string, double>& totals() const { return totals_; }
  std::string table(int steps = 1) const;

  // Times a scope into a forward segment.
  struct Scope {
    SegmentProfiler* p;
    std::string segment;
    Clock::time_point start = Clock::now();
    ~Scope() {
      if (p) p->add(segment, std::chrono::duration<double>(Clock::now() - start).count());
    }
  };

 private:
  std::map<std::string, double> totals_;
  std::map<int, Clock::time_point> bwd_start_, bwd_end_;
  friend struct ProfileMark;
};

}  // namespace meshtrain
