// Distributed data parallel (Li et al., "PyTorch Distributed", arXiv 2006.15704):
// gradient all-reduce in buckets, overlapped with backward.
//
// Parameters are grouped into buckets of about `bucket_bytes` (fp32) in
// reverse registration order, roughly the order backward produces their
// gradients. A post-hook on each parameter's gradient accumulator marks it
// ready (after accumulation: the gradient is final for this backward); when
// a bucket is complete and every bucket before it has been launched, its
// all-reduce starts asynchronously, while backward goes on. A callback at the
// end of backward waits for the buckets.
//
// Gradients are views of the buckets (PyTorch's gradient_as_bucket_view):
// zero_grad() zeroes the buckets and points each parameter's .grad at its
// slot, autograd accumulates into it in place, and the all-reduce sums the
// gradients where they lie, so the buckets cost no memory beyond the
// gradients (4 bytes per parameter, not 8). A gradient found elsewhere (its
// .grad reset after zero_grad) is copied into its slot when ready and the
// sum copied back at the end.
//
// Invariants:
// - Every rank launches the buckets in the same order (index order), which
//   is what matches collectives across ranks; a bucket waits for its
//   predecessors even when it is ready first.
// - Gradients are summed (not averaged): the loss is already divided by the
//   global token count (train/step.h).
// - Micro-steps of gradient accumulation run with sync off: no hook does
//   anything, gradients accumulate locally; only the last backward reduces.
// - A parameter that gets no gradient in a synchronised backward is an error
//   naming it, unless find_unused is set: then it counts as zero (and every
//   rank still launches every bucket).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/nn/params.h"

namespace meshtrain {

class Comm;

struct DdpOptions {
  int64_t bucket_bytes = 25 << 20;  // 25 MiB, PyTorch's default
  bool overlap = true;              // false: every bucket is reduced after backward (baseline)
  bool find_unused = false;
};

class DataParallel {
 public:
  // Broadcasts the parameters from data-parallel rank 0 and installs the hooks.
  DataParallel(std::vector<Param>& params, Comm& dp, DdpOptions o = {});
  ~DataParallel();

  // Before a step's first backward: zeroes the buckets, each gradient a view of its slot.
  void zero_grad();
  // Whether the next backward reduces (the last micro-batch of a step).
  void set_sync(bool sync);
  // After the synchronised backward: throws if it never ran or a bucket did not complete.
  void finish();

  size_t buckets() const;
  std::vector<at::Tensor> flats() const;  // the buckets' flat fp32 buffers
  // Parameter names per bucket, in launch order (for tests and the log).
  std::vector<std::vector<std::string>> bucket_names() const;

  struct State;  // buckets, readiness, hooks (ddp.cpp)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace meshtrain
