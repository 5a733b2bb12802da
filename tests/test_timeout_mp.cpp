// A collective that another rank never joins fails after the configured timeout
// with an error naming the op, the group, the sequence number and the shape.
// Rank 1 skips the call (and stays alive past the timeouts); rank 0 checks the text,
// first of a reduce-scatter over shared memory (its barrier's timeout), then of
// an all-reduce over Gloo. Then rank 1 exits while rank 0 waits for it at a
// shared-memory barrier: rank 0's error names it at once, not after the timeout.
#include <unistd.h>

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"

int main() {
  using namespace meshtrain;
  RuntimeOptions opts;
  opts.timeout = std::chrono::seconds(2);
  auto rt = Runtime::init(DistEnv::from_environment(), opts);
  if (rt->world_size() != 2) {
    fmt::print(stderr, "run with 2 ranks\n");
    return 2;
  }
  at::Tensor t = at::ones({4, 8});
  rt->world().all_reduce(t);  // sequence 1: both ranks join
  auto pair = rt->new_group({0, 1}, "pair");
  at::Tensor half = at::zeros({2, 8});
  pair->reduce_scatter(half, t);  // both join: the pair's shared memory exists now
  auto pair2 = rt->new_group({0, 1}, "pair2");
  pair2->reduce_scatter(half, t);
  const bool shm = pair->shm_available() && pair2->shm_available();
  if (rt->rank() == 1) {
    // Miss the next calls on purpose, stay connected past rank 0's two timeouts
    // (at ~2 s and ~4 s), then exit while rank 0 waits in pair2 (until ~6 s).
    sleep(5);
    std::fflush(nullptr);
    _exit(0);
  }
  int failures = 0;
  auto expect = [&](const std::string& msg, const std::string& part) {
    if (msg.find(part) == std::string::npos) {
      fmt::print("FAIL: error text lacks '{}'\n", part);
      ++failures;
    }
  };
  if (shm) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      pair->reduce_scatter(half, t, ReduceOp::Sum, ScatterAlgo::Shm);
      fmt::print("FAIL: the shared-memory reduce_scatter did not time out\n");
      ++failures;
    } catch (const CommError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string msg = e.what();
      fmt::print("got (after {:.1f} s): {}\n", s, msg);
      expect(msg, "reduce_scatter");
      expect(msg, "group 'pair'");
      expect(msg, "sequence 2");
      expect(msg, "shape [4, 8]");
      expect(msg, "shared-memory barrier");
      if (s < 1.5 || s > 30) {
        fmt::print("FAIL: took {:.1f} s for a 2 s timeout\n", s);
        ++failures;
      }
    }
  } else {
    fmt::print("note: no shared memory between the ranks here; its timeout is not tested\n");
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    rt->world().all_reduce(t, ReduceOp::Sum, ReduceAlgo::Native);  // Gloo's own timeout
    fmt::print("FAIL: the all_reduce did not time out\n");
    ++failures;
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string msg = e.what();
    fmt::print("got (after {:.1f} s): {}\n", s, msg);
    expect(msg, "all_reduce");
    expect(msg, "group 'world'");
    expect(msg, "sequence 2");
    expect(msg, "shape [4, 8]");
    expect(msg, "dtype Float");
    if (s > 30) {
      fmt::print("FAIL: took {:.1f} s for a 2 s timeout\n", s);
      ++failures;
    }
  }
  if (shm) {
    t0 = std::chrono::steady_clock::now();
    try {
      pair2->reduce_scatter(half, t, ReduceOp::Sum, ScatterAlgo::Shm);
      fmt::print("FAIL: the reduce_scatter with an exited rank did not fail\n");
      ++failures;
    } catch (const CommError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::string msg = e.what();
      fmt::print("got (after {:.1f} s): {}\n", s, msg);
      expect(msg, "group 'pair2'");
      expect(msg, "group rank 1");
      expect(msg, "exited");
      if (s > 1.9) {
        fmt::print("FAIL: took {:.1f} s: the exit was not noticed before the 2 s timeout\n", s);
        ++failures;
      }
    }
  }
  fmt::print("{}\n", failures ? "timeout test FAILED" : "timeout test passed");
  std::fflush(nullptr);
  _exit(failures ? 1 : 0);  // the group is poisoned: skip its destructor
}
