// Every collective x dtype against an expectation computed locally, on real
// ranks over Gloo. Inputs are small integers, exact in every dtype, so results
// are compared exactly, except the bf16 accumulation test, whose expectation is
// the fp32 sum rounded once to bf16.
#include <unistd.h>

#include <filesystem>

#include <functional>

#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <fmt/format.h>

#include "meshtrain/comm/comm.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong};

at::Tensor ints(int64_t n, int64_t mod, int64_t offset, at::ScalarType dt) {
  return (at::arange(n, at::kLong).remainder(mod) + offset).to(dt);
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.to(at::kDouble).equal(b.to(at::kDouble));
}

std::string name(at::ScalarType dt) { return c10::toString(dt); }

TEST(Comm, AllReduceSumMaxAvgEveryAlgorithm) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  std::vector<Transport> algos{Transport::Auto, Transport::Native};
  if (c.shm_available()) algos.push_back(Transport::Shm);
  for (auto algo : algos) {
    // 10 elements: fewer than ranks per part on some; 1 element: parts of zero.
    for (int64_t len : {10, 1}) {
      for (auto dt : kDtypes) {
        const std::string what = fmt::format("{} {} x{}", to_string(algo), name(dt), len);
        at::Tensor t = ints(len, 4, me, dt);
        c.all_reduce(t, ReduceOp::Sum, algo);
        EXPECT_TRUE(same(t, at::arange(len, at::kLong).remainder(4) * n + n * (n - 1) / 2)) << what;

        at::Tensor m = ints(len, 4, me, dt);
        c.all_reduce(m, ReduceOp::Max, algo);
        EXPECT_TRUE(same(m, at::arange(len, at::kLong).remainder(4) + (n - 1))) << what;

        if (at::isFloatingType(dt)) {
          at::Tensor a = at::full({len}, static_cast<double>(2 * me), at::TensorOptions().dtype(dt));
          c.all_reduce(a, ReduceOp::Avg, algo);
          EXPECT_TRUE(same(a, at::full({len}, static_cast<double>(n - 1), at::kDouble))) << what;
        }
      }
    }
  }
}

// Comm::blocked_seconds is the communication the caller did not hide (train/exposed_comm.h):
// a synchronous all-reduce that waits 0.3 s for late ranks counts those 0.3 s on the early
// rank, once (all_reduce is all_reduce_async and wait: not counted twice); an asynchronous one
// issued before 0.3 s of the caller's own work, and waited for after it, counts almost nothing.
TEST(Comm, BlockedSecondsCountWhatTheCallerWaitsNotWhatItHid) {
  Comm& c = runtime().world();
  const int me = c.rank();
  c.barrier();
  const double before = c.blocked_seconds();
  if (me != 0) usleep(300000);
  at::Tensor t = at::ones({16});
  c.all_reduce(t, ReduceOp::Sum);
  const double exposed = c.blocked_seconds() - before;
  if (me == 0) {
    EXPECT_GE(exposed, 0.25);
    EXPECT_LT(exposed, 0.3 + 1.0);
  }
  c.barrier();
  const double before_hidden = c.blocked_seconds();
  at::Tensor u = at::ones({16});
  if (me == 0) {
    CommWork w = c.all_reduce_async(u, ReduceOp::Sum, Transport::Native);  // Gloo's thread runs it
    usleep(300000);  // the caller's own work meanwhile
    w.wait();
    EXPECT_LT(c.blocked_seconds() - before_hidden, 0.2);
  } else {
    usleep(100000);
    c.all_reduce(u, ReduceOp::Sum, Transport::Native);
  }
  EXPECT_EQ(u[0].item<float>(), static_cast<float>(c.size()));
}

TEST(Comm, AllReduceBf16AccumulatesInFp32) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  // 256 + 1 + 1 + ... is not representable step by step in bf16 (8-bit mantissa);
  // the fp32 sum rounded once is what Comm promises.
  const float want = at::tensor({256.0f + (n - 1)}, at::kFloat).to(at::kBFloat16).item<float>();
  std::vector<Transport> algos{Transport::Native};
  if (c.shm_available()) algos.push_back(Transport::Shm);
  for (auto algo : algos) {
    at::Tensor t = at::full({4}, me == 0 ? 256.0 : 1.0, at::kBFloat16);
    c.all_reduce(t, ReduceOp::Sum, algo);
    EXPECT_EQ(t[0].item<float>(), want) << to_string(algo);
  }
}

TEST(Comm, AllReduceAvgOnIntegersIsAnError) {
  at::Tensor t = at::zeros({2}, at::kInt);
  EXPECT_THROW(runtime().world().all_reduce(t, ReduceOp::Avg), std::invalid_argument);
}

TEST(Comm, AllGatherEveryAlgorithm) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  std::vector<GatherAlgo> algos{GatherAlgo::Auto, GatherAlgo::Broadcast, GatherAlgo::Ring, GatherAlgo::List};
  if (c.shm_available()) algos.push_back(GatherAlgo::Shm);
  for (auto algo : algos) {
    for (auto dt : kDtypes) {
      const int64_t m = 7;
      at::Tensor in = ints(m, 5, 10 * me, dt), out = at::zeros({n, m}, dt);
      c.all_gather(out, in, algo);
      at::Tensor want = at::arange(m, at::kLong).remainder(5).repeat({n, 1}) + at::arange(n, at::kLong).unsqueeze(1) * 10;
      EXPECT_TRUE(same(out, want)) << to_string(algo) << " " << name(dt);
    }
  }
}

TEST(Comm, ReduceScatterEveryAlgorithm) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  std::vector<ScatterAlgo> algos{ScatterAlgo::Auto, ScatterAlgo::AllToAll, ScatterAlgo::Ring, ScatterAlgo::AllReduce};
  if (c.shm_available()) algos.push_back(ScatterAlgo::Shm);
  for (auto algo : algos) {
    for (auto dt : kDtypes) {
      const int64_t m = 5;
      at::Tensor in = ints(n * m, 3, me, dt), out = at::zeros({m}, dt);
      c.reduce_scatter(out, in, ReduceOp::Sum, algo);
      at::Tensor idx = at::arange(m, at::kLong) + me * m;
      EXPECT_TRUE(same(out, idx.remainder(3) * n + n * (n - 1) / 2)) << to_string(algo) << " " << name(dt);

      at::Tensor mx = at::zeros({m}, dt);
      c.reduce_scatter(mx, in, ReduceOp::Max, algo);
      EXPECT_TRUE(same(mx, idx.remainder(3) + (n - 1))) << "max " << to_string(algo) << " " << name(dt);

      if (at::isFloatingType(dt)) {
        at::Tensor avg_in = at::full({n * m}, static_cast<double>(2 * me), at::TensorOptions().dtype(dt));
        at::Tensor avg = at::zeros({m}, dt);
        c.reduce_scatter(avg, avg_in, ReduceOp::Avg, algo);
        EXPECT_TRUE(same(avg, at::full({m}, static_cast<double>(n - 1), at::kDouble)))
            << "avg " << to_string(algo) << " " << name(dt);
      }
    }
  }
}

TEST(Comm, SharedMemoryOpsLargerThanTheirBufferRunInPieces) {
  // Just over 32 MiB of fp32 per rank: more than one buffer (kShmPieceBytes in
  // comm.cpp), so a whole piece and a short one; values differ along the tensor
  // so a piece written to the wrong place shows. (int32 patterns, float
  // compares: tensors this size are slow to build in int64.)
  Comm& c = runtime().world();
  if (!c.shm_available()) GTEST_SKIP() << "no shared memory between these ranks";
  const int n = c.size(), me = c.rank();
  const int64_t m = (int64_t{32} << 20) / 4 + 3;
  auto pattern = [](int64_t len, int64_t start) {
    return at::arange(start, start + len, at::kInt).remainder(1000).to(at::kFloat);
  };
  at::Tensor t = pattern(m, 0) + me;
  c.all_reduce(t, ReduceOp::Sum, Transport::Shm);
  EXPECT_TRUE(t.equal(pattern(m, 0) * n + n * (n - 1) / 2));

  at::Tensor out = at::zeros({n, m});
  c.all_gather(out, pattern(m, 0) + 10 * me, GatherAlgo::Shm);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(out[r].equal(pattern(m, 0) + 10 * r)) << "from rank " << r;

  at::Tensor in = pattern(n * m, 0) + me, mine = at::zeros({m});
  c.reduce_scatter(mine, in, ReduceOp::Sum, ScatterAlgo::Shm);
  EXPECT_TRUE(mine.equal(pattern(m, me * m) * n + n * (n - 1) / 2));

  at::Tensor b = me == n - 1 ? pattern(m, 7) : at::zeros({m});
  c.broadcast(b, n - 1, Transport::Shm);
  EXPECT_TRUE(b.equal(pattern(m, 7)));
}

TEST(Comm, LargeReduceScatterAndAllGatherTakeTheRingInPieces) {
  // 1 Mi elements per rank: above the Auto thresholds, and the ring moves each
  // chunk in several pieces (comm.cpp), so piece boundaries are exercised.
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  const int64_t m = int64_t{1} << 20;
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Max}) {
      at::Tensor in = ints(n * m, 3, me, dt), out = at::zeros({m}, dt);
      c.reduce_scatter(out, in, op);
      at::Tensor base = (at::arange(m, at::kLong) + me * m).remainder(3);
      at::Tensor want = op == ReduceOp::Sum ? base * n + n * (n - 1) / 2 : base + (n - 1);
      EXPECT_TRUE(same(out, want)) << to_string(op) << " " << name(dt);
    }
    at::Tensor in = ints(m, 5, me, dt), out = at::zeros({n, m}, dt);
    c.all_gather(out, in);
    EXPECT_TRUE(same(out, at::arange(m, at::kLong).remainder(5).repeat({n, 1}) + at::arange(n, at::kLong).unsqueeze(1)))
        << name(dt);
  }
}

TEST(Comm, InPlaceGatherAndScatterEveryAlgorithm) {
  // ZeRO gathers into the flat its shard is a view of, and reduce-scatters a
  // gradient into its own chunk: `in` aliases this rank's part of `out` / `out`
  // aliases this rank's chunk of `in`.
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  const int64_t m = 3000;  // > one block of the one-pass sum
  std::vector<GatherAlgo> gathers{GatherAlgo::Auto, GatherAlgo::Broadcast, GatherAlgo::Ring};
  std::vector<ScatterAlgo> scatters{ScatterAlgo::Auto, ScatterAlgo::AllToAll, ScatterAlgo::Ring};
  if (c.shm_available()) {
    gathers.push_back(GatherAlgo::Shm);
    scatters.push_back(ScatterAlgo::Shm);
  }
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    for (auto algo : gathers) {
      at::Tensor flat = at::zeros({n * m}, dt);
      at::Tensor shard = flat.narrow(0, me * m, m);
      shard.copy_(ints(m, 5, 10 * me, dt));
      c.all_gather(flat, shard, algo);
      at::Tensor want = at::arange(m, at::kLong).remainder(5).repeat({n}) + at::arange(n, at::kLong).repeat_interleave(m) * 10;
      EXPECT_TRUE(same(flat, want)) << to_string(algo) << " " << name(dt);
    }
    for (auto algo : scatters) {
      at::Tensor grad = ints(n * m, 3, me, dt);
      at::Tensor mine = grad.narrow(0, me * m, m);
      c.reduce_scatter(mine, grad, ReduceOp::Sum, algo);
      EXPECT_TRUE(same(mine, (at::arange(m, at::kLong) + me * m).remainder(3) * n + n * (n - 1) / 2))
          << to_string(algo) << " " << name(dt);
    }
  }
}

TEST(Comm, SharedMemoryBuffersSurviveRanksOfDifferentSpeed) {
  // Consecutive operations alternate between two buffers per rank (shm_group.h);
  // a rank that runs ahead must never overwrite what a slower one still reads.
  // One rank at a time is held back, and each round's data differs.
  Comm& c = runtime().world();
  if (!c.shm_available()) GTEST_SKIP() << "no shared memory between these ranks";
  const int n = c.size(), me = c.rank();
  const int64_t m = int64_t{1} << 16;
  for (int round = 0; round < 24; ++round) {
    if (me == round % n) usleep(2000);
    at::Tensor in = at::full({n * m}, static_cast<float>(round * 100 + me));
    at::Tensor out = at::empty({m});
    c.reduce_scatter(out, in, ReduceOp::Sum, ScatterAlgo::Shm);
    EXPECT_EQ(out.min().item<float>(), static_cast<float>(n * round * 100 + n * (n - 1) / 2)) << round;
    EXPECT_EQ(out.max().item<float>(), out.min().item<float>()) << round;
    at::Tensor g = at::empty({n * m});
    c.all_gather(g, at::full({m}, static_cast<float>(round + me)), GatherAlgo::Shm);
    EXPECT_TRUE(g.view({n, m}).equal((at::arange(n, at::kFloat) + round).unsqueeze(1).expand({n, m}))) << round;
    at::Tensor bc = at::full({m}, static_cast<float>(me == round % n ? round : -1));
    c.broadcast(bc, round % n, Transport::Shm);
    EXPECT_EQ(bc.min().item<float>(), static_cast<float>(round)) << round;
    EXPECT_EQ(bc.max().item<float>(), static_cast<float>(round)) << round;
    at::Tensor r = at::full({m}, static_cast<float>(round * 10 + me));
    c.all_reduce(r, ReduceOp::Sum, Transport::Shm);
    EXPECT_EQ(r.min().item<float>(), static_cast<float>(n * round * 10 + n * (n - 1) / 2)) << round;
    EXPECT_EQ(r.max().item<float>(), r.min().item<float>()) << round;
  }
}

TEST(Comm, SharedMemoryIsOneDecisionForTheWholeGroup) {
  // MESHTRAIN_SHM=0 on one rank turns shared memory off for the group on every
  // rank (a rank deciding alone would deadlock the others); Auto then uses Gloo,
  // and asking for shm is one clear error.
  Comm& world = runtime().world();
  if (world.rank() == 0) setenv("MESHTRAIN_SHM", "0", 1);
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  auto g = runtime().new_group(all, "noshm");
  EXPECT_FALSE(g->shm_available());
  unsetenv("MESHTRAIN_SHM");
  const int n = g->size(), me = g->rank();
  at::Tensor in = ints(n * 4, 3, me, at::kFloat), out = at::zeros({4});
  g->reduce_scatter(out, in);
  EXPECT_TRUE(same(out, (at::arange(4, at::kLong) + me * 4).remainder(3) * n + n * (n - 1) / 2));
  try {
    g->reduce_scatter(out, in, ReduceOp::Sum, ScatterAlgo::Shm);
    ADD_FAILURE() << "shm on a group without shared memory did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MESHTRAIN_SHM=0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use auto"), std::string::npos) << e.what();
  }
}

TEST(Comm, SharedMemoryThatCannotBeMadeIsOneFallbackAndLeavesNoFiles) {
  // Rank 0 cannot create its segment (its MESHTRAIN_SHM_DIR does not exist);
  // the others can: every rank falls back to Gloo, the others remove the
  // segments they made, and asking for shm says why.
  Comm& world = runtime().world();
  const int n = world.size(), me = world.rank();
  at::Tensor pid0 = at::full({1}, static_cast<int64_t>(getpid()), at::kLong);
  world.broadcast(pid0, 0);
  if (me == 0) setenv("MESHTRAIN_SHM_DIR", "/nonexistent-meshtrain-shm", 1);
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  auto g = runtime().new_group(all, "badshm");
  EXPECT_FALSE(g->shm_available());
  unsetenv("MESHTRAIN_SHM_DIR");
  at::Tensor in = ints(n * 4, 3, me, at::kFloat), out = at::zeros({4});
  g->reduce_scatter(out, in);
  EXPECT_TRUE(same(out, (at::arange(4, at::kLong) + me * 4).remainder(3) * n + n * (n - 1) / 2));
  try {
    g->all_gather(at::zeros({n * 4}), out, GatherAlgo::Shm);
    ADD_FAILURE() << "shm on a group without shared memory did not throw";
  } catch (const std::invalid_argument& e) {
    const std::string want = me == 0 ? "cannot create /nonexistent-meshtrain-shm/" : "another rank could not create";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  world.barrier();
  const std::string prefix = fmt::format("meshtrain-{}-", pid0.item<int64_t>());
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0u) << "left behind: " << entry.path();
  }
}

TEST(Comm, AMistypedSharedMemorySwitchIsOneClearError) {
  Comm& world = runtime().world();
  setenv("MESHTRAIN_SHM", "off", 1);  // every rank, as a launcher would
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  auto g = runtime().new_group(all, "typo");
  try {
    g->shm_available();
    ADD_FAILURE() << "MESHTRAIN_SHM=off was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MESHTRAIN_SHM='off'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use 1"), std::string::npos) << e.what();
  }
  unsetenv("MESHTRAIN_SHM");
  EXPECT_TRUE(g->shm_available());  // nothing was decided: set-up runs on the next call
}

TEST(Comm, SharedMemoryHoldsCpuTensorsOnly) {
  // A device tensor on a Gloo group is never copied through /dev/shm: asking for
  // shm is an error naming the device (checked before any traffic).
  Comm& c = runtime().world();
  if (!c.shm_available()) GTEST_SKIP() << "no shared memory between these ranks";
  at::Tensor t = at::empty({8}, at::TensorOptions().device(at::kMeta));
  try {
    c.all_reduce(t, ReduceOp::Sum, Transport::Shm);
    ADD_FAILURE() << "shm took a meta tensor";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("on meta"), std::string::npos) << e.what();
  }
}

TEST(Comm, BroadcastFromEveryRootEveryAlgorithm) {
  Comm& c = runtime().world();
  std::vector<Transport> algos{Transport::Auto, Transport::Native};
  if (c.shm_available()) algos.push_back(Transport::Shm);
  for (auto algo : algos) {
    for (int root = 0; root < c.size(); ++root) {
      for (auto dt : kDtypes) {
        at::Tensor t = c.rank() == root ? ints(9, 7, root, dt) : at::zeros({9}, dt);
        c.broadcast(t, root, algo);
        EXPECT_TRUE(same(t, ints(9, 7, root, at::kLong))) << to_string(algo) << " root " << root << " " << name(dt);
      }
    }
  }
}

TEST(Comm, AllToAllEqualSplits) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  for (auto dt : kDtypes) {
    // Row block d of rank r holds r*n + d; block s received here must hold s*n + me.
    at::Tensor in = (at::arange(n, at::kLong).repeat_interleave(2) + me * n).to(dt).reshape({2 * n, 1}).repeat({1, 3});
    at::Tensor out = at::zeros({2 * n, 3}, dt);
    c.all_to_all(out, in);
    at::Tensor want = (at::arange(n, at::kLong).repeat_interleave(2) * n + me).reshape({2 * n, 1}).repeat({1, 3});
    EXPECT_TRUE(same(out, want)) << name(dt);
  }
}

TEST(Comm, AllToAllUnevenSplits) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  // Rank r sends (r + d) % 3 rows to rank d, each row holding 100*r + d.
  auto rows = [](int from, int to) -> int64_t { return (from + to) % 3; };
  for (auto dt : kDtypes) {
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> in_parts, want_parts;
    for (int d = 0; d < n; ++d) {
      in_splits.push_back(rows(me, d));
      out_splits.push_back(rows(d, me));
      in_parts.push_back(at::full({rows(me, d), 2}, 10 * me + d, at::kLong));
      want_parts.push_back(at::full({rows(d, me), 2}, 10 * d + me, at::kLong));
    }
    at::Tensor in = at::cat(in_parts).to(dt), want = at::cat(want_parts);
    at::Tensor out = at::zeros({want.size(0), 2}, dt);
    c.all_to_all(out, in, out_splits, in_splits);
    EXPECT_TRUE(same(out, want)) << name(dt);
  }
}

TEST(Comm, AllToAllBadSplitsAreClearErrors) {
  Comm& c = runtime().world();
  at::Tensor in = at::zeros({3}), out = at::zeros({3});
  try {
    c.all_to_all(out, in, {1}, {1});
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("splits"), std::string::npos) << e.what();
  }
}

TEST(Comm, SendRecvAroundTheRing) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  for (auto dt : kDtypes) {
    at::Tensor out = ints(6, 4, me, dt), in = at::zeros({6}, dt);
    // Even ranks send first, odd ranks receive first; isend/irecv would also do.
    CommWork s = c.isend(out, (me + 1) % n, 3);
    CommWork r = c.irecv(in, (me - 1 + n) % n, 3);
    s.wait();
    r.wait();
    EXPECT_TRUE(same(in, ints(6, 4, (me - 1 + n) % n, at::kLong))) << name(dt);
  }
}

TEST(Comm, CountersFollowNcclTestsSizes) {
  Comm& c = runtime().world();
  const int n = c.size();
  c.reset_stats();
  const uint64_t seq0 = c.seq();
  at::Tensor t = at::zeros({1000});
  c.all_reduce(t);
  at::Tensor out = at::zeros({n * 10}), in = at::zeros({10});
  c.all_gather(out, in);
  c.reduce_scatter(in, out);
  const auto& s = c.stats();
  EXPECT_EQ(c.seq(), seq0 + 3);
  EXPECT_EQ(s.at("all_reduce").calls, 1u);
  EXPECT_EQ(s.at("all_reduce").bytes, 4000u);
  EXPECT_EQ(s.at("all_reduce").wire_bytes, static_cast<uint64_t>(2.0 * (n - 1) / n * 4000 + 0.5));
  EXPECT_EQ(s.at("all_gather").bytes, static_cast<uint64_t>(n * 40));
  EXPECT_EQ(s.at("reduce_scatter").bytes, static_cast<uint64_t>(n * 40));
  EXPECT_EQ(s.at("reduce_scatter").wire_bytes, static_cast<uint64_t>((n - 1) * 40));
}

// moved_bytes counts what the algorithm that ran moved, where it moves it, not
// a formula: a shared-memory broadcast is read by the others from the root
// (the root moves nothing); the ring all-gather sends only to the right
// neighbour; an all-reduce of 1001 elements reads exactly the parts it needs;
// uneven all-to-all chunks go to their peers; and a reduce-scatter done as a
// Gloo all-reduce moves twice and more what the bandwidth-optimal formula says.
TEST(Comm, MovedBytesAreCountedWhereTheAlgorithmMovesThem) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank(), right = (me + 1) % n;
  auto sum = [](const OpStats& s) {
    uint64_t t = 0;
    for (const auto& [peer, b] : s.peers) t += b;
    return t;
  };
  if (c.shm_available()) {
    c.reset_stats();
    at::Tensor t = at::zeros({1000});
    c.broadcast(t, 1, Transport::Shm);
    const OpStats& b = c.stats().at("broadcast");
    EXPECT_EQ(b.moved_bytes, me == 1 ? 0u : 4000u);
    if (me != 1) EXPECT_EQ(b.peers, (std::map<int, uint64_t>{{1, 4000}}));
    c.all_reduce(t = at::zeros({1001}), ReduceOp::Sum, Transport::Shm);
    const int64_t mine = 1001 * (me + 1) / n - 1001 * me / n;  // the part this rank reduces
    EXPECT_EQ(c.stats().at("all_reduce").moved_bytes, static_cast<uint64_t>(((n - 1) * mine + 1001 - mine) * 4));
    EXPECT_EQ(sum(c.stats().at("all_reduce")), c.stats().at("all_reduce").moved_bytes);
  }
  c.reset_stats();
  at::Tensor out = at::zeros({n * 10}), in = at::zeros({10});
  c.all_gather(out, in, GatherAlgo::Ring);
  EXPECT_EQ(c.stats().at("all_gather").peers, (std::map<int, uint64_t>{{right, static_cast<uint64_t>((n - 1) * 40)}}));
  // Rank r sends r + 1 rows of 3 floats to each peer.
  std::vector<int64_t> in_splits(n, me + 1), out_splits;
  for (int r = 0; r < n; ++r) out_splits.push_back(r + 1);
  // Over Gloo counted as sent (to each peer); over shared memory as read (from each peer).
  at::Tensor a2a_in = at::zeros({n * (me + 1), 3}), a2a_out = at::zeros({n * (n + 1) / 2, 3});
  c.all_to_all(a2a_out, a2a_in, out_splits, in_splits, Transport::Native);
  for (const auto& [peer, b] : c.stats().at("all_to_all").peers) EXPECT_EQ(b, static_cast<uint64_t>((me + 1) * 12));
  EXPECT_EQ(c.stats().at("all_to_all").moved_bytes, static_cast<uint64_t>((n - 1) * (me + 1) * 12));
  if (c.shm_available()) {
    c.reset_stats();
    c.all_to_all(a2a_out, a2a_in, out_splits, in_splits, Transport::Shm);
    uint64_t from_peers = 0;
    for (const auto& [peer, b] : c.stats().at("all_to_all").peers) {
      EXPECT_EQ(b, static_cast<uint64_t>((peer + 1) * 12)) << "from " << peer;
      from_peers += b;
    }
    EXPECT_EQ(c.stats().at("all_to_all").moved_bytes, from_peers);
    EXPECT_EQ(c.stats().at("all_to_all").peers.size(), static_cast<size_t>(n - 1));
  }
  c.reduce_scatter(in, out, ReduceOp::Sum, ScatterAlgo::AllReduce);
  const OpStats& rs = c.stats().at("reduce_scatter");
  EXPECT_EQ(rs.wire_bytes, static_cast<uint64_t>((n - 1) * 40));
  EXPECT_EQ(rs.moved_bytes, static_cast<uint64_t>(2 * (n - 1) * n * 40 / n));
}

// The shared-memory all-to-all gives Gloo's result bitwise: uneven splits
// (some chunks empty), a rank that sends and receives nothing, an exchange
// larger than the segment (several rounds), in every dtype; rows hold (sender,
// receiver, row) so a chunk put in the wrong place is also caught.
// Both shared-memory paths: one copy (cross-memory attach) where the ranks may
// read each other, as here, and through the segments (MESHTRAIN_SHM_CMA=0).
void check_shm_all_to_all(Comm& c);

TEST(Comm, SharedMemoryAllToAllEqualsGloos) {
  Runtime& rt = runtime();
  if (!rt.world().shm_available()) GTEST_SKIP() << "no shared memory for this group";
  std::vector<int> all;
  for (int r = 0; r < rt.world_size(); ++r) all.push_back(r);
  for (const bool single_copy : {true, false}) {
    SCOPED_TRACE(single_copy ? "one copy" : "through the segments");
    std::unique_ptr<Comm> c = rt.new_group(all, single_copy ? "a2a_cma" : "a2a_segments");
    if (!single_copy) setenv("MESHTRAIN_SHM_CMA", "0", 1);
    check_shm_all_to_all(*c);
    unsetenv("MESHTRAIN_SHM_CMA");
    EXPECT_EQ(c->all_to_all_single_copy(), single_copy);
  }
}

void check_shm_all_to_all(Comm& c) {
  const int n = c.size(), me = c.rank();
  struct Case {
    const char* name;
    std::function<int64_t(int, int)> rows;  // rows rank s sends to rank q
    int64_t width;
  };
  const std::vector<Case> cases = {
      {"uneven", [](int s, int q) { return static_cast<int64_t>((s + 2 * q) % 3); }, 5},
      {"a silent rank", [n](int s, int q) { return s == n - 1 || q == n - 1 ? int64_t{0} : int64_t{2}; }, 3},
      {"several rounds", [](int, int) { return int64_t{800}; }, 1024},  // 3.1 MiB per peer in fp32
  };
  for (const auto& cs : cases) {
    for (auto dt : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong}) {
      SCOPED_TRACE(std::string(cs.name) + " " + c10::toString(dt));
      std::vector<int64_t> in_splits, out_splits;
      std::vector<at::Tensor> chunks;
      for (int q = 0; q < n; ++q) {
        in_splits.push_back(cs.rows(me, q));
        out_splits.push_back(cs.rows(q, me));
        chunks.push_back((at::arange(in_splits.back() * cs.width, at::kLong).remainder(61) + 64 * q + 16 * me)
                             .view({in_splits.back(), cs.width}));
      }
      const at::Tensor in = at::cat(chunks).to(dt);
      int64_t total = 0;
      for (auto r : out_splits) total += r;
      at::Tensor shm_out = at::full({total, cs.width}, -1, dt), gloo_out = at::full({total, cs.width}, -2, dt);
      c.all_to_all(shm_out, in, out_splits, in_splits, Transport::Shm);
      c.all_to_all(gloo_out, in, out_splits, in_splits, Transport::Native);
      EXPECT_TRUE(at::equal(shm_out, gloo_out));
      int64_t at_row = 0;  // chunk from rank s: its rows' values as s built them
      for (int s = 0; s < n; ++s) {
        const at::Tensor want = (at::arange(out_splits[s] * cs.width, at::kLong).remainder(61) + 64 * me + 16 * s)
                                    .view({out_splits[s], cs.width})
                                    .to(dt);
        EXPECT_TRUE(at::equal(shm_out.narrow(0, at_row, out_splits[s]), want)) << "from rank " << s;
        at_row += out_splits[s];
      }
    }
  }
}

TEST(Comm, AsyncAllReducesOverlap) {
  Comm& c = runtime().world();
  const int n = c.size();
  std::vector<at::Tensor> ts;
  std::vector<CommWork> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(at::full({100}, static_cast<double>(i), at::kFloat));
    works.push_back(c.all_reduce_async(ts.back()));
  }
  for (auto& w : works) w.wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ts[i][0].item<float>(), static_cast<float>(i * n));
}

TEST(Comm, SubgroupOfEvenRanks) {
  Runtime& rt = runtime();
  std::vector<int> evens;
  for (int r = 0; r < rt.world_size(); r += 2) evens.push_back(r);
  if (rt.rank() % 2 != 0) return;
  auto g = rt.new_group(evens, "evens");
  at::Tensor t = at::full({1}, static_cast<double>(rt.rank()), at::kLong);
  g->all_reduce(t);
  int64_t want = 0;
  for (int r : evens) want += r;
  EXPECT_EQ(t.item<int64_t>(), want);
}

}  // namespace
}  // namespace meshtrain::test
