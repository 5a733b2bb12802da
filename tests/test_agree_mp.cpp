// Agreement checks (comm.h, call.h): ranks that disagree on a collective — its
// size, its op, its root, or one rank skipping a call — get one error on every
// rank, naming this rank's call and the first disagreeing rank's, within a
// bounded time, over shared memory (every call) and over Gloo (every
// check_every-th call). Rank 1 is the odd one out in every case.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <string>

#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

// Runs `call` (this rank's calls) on a fresh group over every rank; it must
// throw CommError on every rank within 10 s, naming this rank's call `mine`
// and the other's: rank 1's `odd` (ranks != 1) or rank 0's `usual` (rank 1).
void expect_disagreement(const std::string& name, const std::function<void(Comm&)>& call, const std::string& usual,
                         const std::string& odd, int check_every = 64) {
  Runtime& rt = runtime();
  std::vector<int> all(rt.world_size());
  for (int r = 0; r < rt.world_size(); ++r) all[r] = r;
  auto group = rt.new_group(all, name);
  group->set_check_every(check_every);
  const int me = group->rank();
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    call(*group);
  } catch (const CommError& e) {
    error = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(error.find("disagree on this call"), std::string::npos) << name << ": " << error;
  const std::string mine = me == 1 ? odd : usual, other = me == 1 ? usual : odd;
  const int other_rank = me == 1 ? 0 : 1;
  EXPECT_NE(error.find(fmt::format("group rank {} called {}", me, mine)), std::string::npos) << name << ": " << error;
  EXPECT_NE(error.find(fmt::format("group rank {} called {}", other_rank, other)), std::string::npos)
      << name << ": " << error;
  EXPECT_LT(s, 10) << name;
}

class Agreement : public ::testing::TestWithParam<Transport> {};

TEST_P(Agreement, MismatchedCollectivesAreOneErrorNamingBothCalls) {
  if (runtime().world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Transport tr = GetParam();
  const bool odd = runtime().rank() == 1;
  const int every = tr == Transport::Native ? 1 : 64;  // Gloo: the debug setting, every call
  const std::string p = to_string(tr);
  expect_disagreement(p + "_sizes", [&](Comm& c) { c.all_reduce(at::ones({odd ? 2000 : 1000}), ReduceOp::Sum, tr); },
                      "all_reduce (sum) at sequence 1 of 1000 Float elements",
                      "all_reduce (sum) at sequence 1 of 2000 Float elements", every);
  expect_disagreement(p + "_ops", [&](Comm& c) {
        at::Tensor t = at::ones({256});
        if (odd) c.broadcast(t, 0, tr);
        else c.all_reduce(t, ReduceOp::Max, tr);
      },
      "all_reduce (max) at sequence 1 of 256 Float elements", "broadcast (root 0) at sequence 1 of 256 Float elements",
      every);
  expect_disagreement(p + "_roots", [&](Comm& c) { c.broadcast(at::ones({64}, at::kLong), odd ? 1 : 0, tr); },
                      "broadcast (root 0) at sequence 1 of 64 Long elements",
                      "broadcast (root 1) at sequence 1 of 64 Long elements", every);
  // Rank 1 skips the all-reduce: its first call is the broadcast after it.
  expect_disagreement(p + "_skip", [&](Comm& c) {
        if (!odd) c.all_reduce(at::ones({128}), ReduceOp::Sum, tr);
        c.broadcast(at::ones({128}), 0, tr);
      },
      "all_reduce (sum) at sequence 1 of 128 Float elements", "broadcast (root 0) at sequence 1 of 128 Float elements",
      every);
  if (tr == Transport::Shm) {
    // Only the others' call needs a larger segment (8 MiB): they agree on it first, through the one they have.
    expect_disagreement(p + "_grow", [&](Comm& c) {
          c.all_reduce(at::ones({16}), ReduceOp::Sum, tr);
          c.all_reduce(at::ones({odd ? 16 : 2 << 20}), ReduceOp::Sum, tr);
        },
        "all_reduce (sum) at sequence 2 of 2097152 Float elements", "all_reduce (sum) at sequence 2 of 16 Float elements");
  } else {
    // The default setting checks every 64th call: a disagreement is found there at the latest.
    expect_disagreement(p + "_default", [&](Comm& c) {
          for (int i = 0; i < 63; ++i) c.all_reduce(at::ones({8}), ReduceOp::Sum, tr);
          c.all_reduce(at::ones({odd ? 9 : 8}), ReduceOp::Sum, tr);
        },
        "all_reduce (sum) at sequence 64 of 8 Float elements", "all_reduce (sum) at sequence 64 of 9 Float elements");
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Agreement, ::testing::Values(Transport::Shm, Transport::Native),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace meshtrain::test
