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
#include <functional>
#include <cstdlib>
#include <string>
#include <vector>

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
  pair2->set_timeout(std::chrono::seconds(10));  // its shared-memory barrier: far beyond the exit
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
  // Runs `call`, which must throw CommError within [min_s, max_s] seconds with
  // every one of `parts` in its text.
  auto expect_error = [&](const char* what, const std::function<void()>& call, std::vector<std::string> parts,
                          double min_s, double max_s) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      call();
      fmt::print("FAIL: {} did not fail\n", what);
      ++failures;
    } catch (const CommError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string msg = e.what();
      fmt::print("got (after {:.1f} s): {}\n", s, msg);
      for (const auto& part : parts) {
        if (msg.find(part) == std::string::npos) {
          fmt::print("FAIL: {}: error text lacks '{}'\n", what, part);
          ++failures;
        }
      }
      if (s < min_s || s > max_s) {
        fmt::print("FAIL: {} failed after {:.1f} s, expected {}-{} s\n", what, s, min_s, max_s);
        ++failures;
      }
    }
  };
  if (!shm) {
    // Two ranks on one host share memory unless the user turned it off: anything else is a failure, not a skip.
    const char* off = std::getenv("MESHTRAIN_SHM");
    if (off != nullptr && std::string(off) == "0") {
      fmt::print("note: MESHTRAIN_SHM=0, so the shared-memory timeout and exited-rank checks do not run\n");
    } else {
      fmt::print("FAIL: the two ranks have no shared memory (MESHTRAIN_SHM is not 0): its errors went untested\n");
      ++failures;
    }
  }
  if (shm) {
    expect_error(
        "the shared-memory reduce_scatter", [&] { pair->reduce_scatter(half, t, ReduceOp::Sum, ScatterAlgo::Shm); },
        {"reduce_scatter", "group 'pair'", "sequence 2", "shape [4, 8]", "shared-memory barrier"}, 1.5, 30);
  }
  expect_error(
      "the all_reduce over Gloo", [&] { rt->world().all_reduce(t, ReduceOp::Sum, Transport::Native); },
      {"all_reduce", "group 'world'", "sequence 2", "shape [4, 8]", "dtype Float"}, 0, 30);
  if (shm) {
    // The exit comes ~1 s into this call; the timeout would come at 10 s.
    expect_error(
        "the reduce_scatter with an exited rank", [&] { pair2->reduce_scatter(half, t, ReduceOp::Sum, ScatterAlgo::Shm); },
        {"group 'pair2'", "group rank 1", "exited"}, 0, 6);
  }
  fmt::print("{}\n", failures ? "timeout test FAILED" : "timeout test passed");
  std::fflush(nullptr);
  _exit(failures ? 1 : 0);  // the group is poisoned: skip its destructor
}
