// Training steps under data parallelism (flat all-reduce and DDP, and dp x tp)
// against one process with the same global batch (tests/train_parity.h).
#include "tests/train_parity.h"

#include "meshtrain/train/memory.h"

namespace meshtrain::test {
namespace {

TEST(Train, DataParallelMatchesOneProcess) {
  if (kGlobal % runtime().world_size() != 0) GTEST_SKIP() << "the global batch of 8 needs dp dividing 8";
  check(1);
}

TEST(Train, DataTimesTensorParallelMatchesOneProcess) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  check(2);
}

TEST(Ddp, MatchesOneProcess) {
  if (kGlobal % runtime().world_size() != 0) GTEST_SKIP() << "the global batch of 8 needs dp dividing 8";
  check(1, Reduce::DdpOverlapped);
  check(1, Reduce::DdpAfterBackward);
  check(1, Reduce::DdpOverlapped, plan::Recompute::Full);
}

TEST(Ddp, TimesTensorParallelMatchesOneProcess) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  check(2, Reduce::DdpOverlapped);
}

// One replica of the test model under DDP over the world (64 KiB buckets).
struct DdpReplica {
  plan::ModelSpec spec = model_spec();
  Comm solo{"solo", runtime().rank()};
  Transformer model{spec, solo, false, 5};
  DataParallel ddp{model.params().params(), runtime().world(), DdpOptions{64 << 10, true, false}};
  AdamW opt{model.params().params(), AdamWOptions{}};
  TrainStep step{model, opt, runtime().world(), solo, {Precision::Fp32, nullptr, &ddp}};
  // This rank's share of the global batch of step 0, as micro-batches of `micro`.
  StepResult run(int64_t micro) {
    Comm& dp = runtime().world();
    const int64_t per_rank = kGlobal / dp.size();
    return step.run(split(global_batch(spec, 0), dp.rank() * per_rank, per_rank, micro));
  }
  double psi() { return static_cast<double>(model.params().local_numel()); }
};

// Per step, each rank all-reduces its whole gradient once: nccl-tests "size"
// bytes = 4 x parameters (plus the two 8-byte scalars every step reduces: the
// token count and the loss); the ring moves 2 (n - 1) / n of that per rank.
TEST(Ddp, CommBytesMatchTheFormula) {
  Comm& dp = runtime().world();
  if (dp.size() == 1) GTEST_SKIP() << "needs dp > 1";
  DdpReplica r;
  r.run(1);  // several micro-batches: one reduction only
  const OpStats before = dp.stats().at("all_reduce");
  r.run(1);
  const OpStats after = dp.stats().at("all_reduce");
  const double psi = r.psi();
  const double n = dp.size();
  EXPECT_EQ(after.bytes - before.bytes, static_cast<uint64_t>(4 * psi + 16));
  EXPECT_EQ(after.calls - before.calls, r.ddp.buckets() + 2);
  EXPECT_NEAR(static_cast<double>(after.wire_bytes - before.wire_bytes), 2 * (n - 1) / n * (4 * psi + 16),
              static_cast<double>(r.ddp.buckets() + 2));
}

// After a step, every rank holds 4Ψ of fp32 weights, 4Ψ of gradients and 8Ψ
// of Adam moments (the 16Ψ of the formula table); DDP's buckets are the
// gradients (views of them), so they add nothing.
TEST(Ddp, MeasuredMemoryMatchesTheFormula) {
  DdpReplica r;
  r.run(kGlobal / runtime().world_size());
  const MemoryUse m = measure_memory(r.model.params().params(), r.opt, &r.ddp);
  const double psi = r.psi();
  EXPECT_NEAR(static_cast<double>(m.state()), 16 * psi, 0.05 * 16 * psi);
  EXPECT_EQ(m.params, static_cast<int64_t>(4 * psi));
  EXPECT_EQ(m.optimizer, static_cast<int64_t>(8 * psi));
  EXPECT_EQ(m.grads, static_cast<int64_t>(4 * psi));
  EXPECT_EQ(m.buffers, 0);
  const std::string table = memory_table(r.model.params().local_numel(), runtime().world_size(), m, "DDP fp32");
  EXPECT_NE(table.find("ZeRO-3: 16P/N"), std::string::npos) << table;
}

TEST(Ddp, BucketsFollowReverseOrderAndUnusedParametersAreNamed) {
  Comm& dp = runtime().world();
  ParamStore store(1, 0, 1);
  at::Tensor a = store.create("a.weight", {64}, Init::Normal, 1.0, -1);
  at::Tensor b = store.create("b.weight", {64}, Init::Normal, 1.0, -1);
  at::Tensor c = store.create("c.weight", {64}, Init::Normal, 1.0, -1);
  {
    DataParallel ddp(store.params(), dp, DdpOptions{256, true, false});  // one parameter per bucket
    EXPECT_EQ(ddp.bucket_names(), (std::vector<std::vector<std::string>>{{"c.weight"}, {"b.weight"}, {"a.weight"}}));
    ddp.set_sync(true);
    (a * c).sum().backward();  // b unused
    try {
      ddp.finish();
      ADD_FAILURE() << "an unused parameter went unnoticed";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("b.weight"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ddp.find_unused"), std::string::npos) << e.what();
    }
  }
  for (auto& p : store.params()) p.tensor.mutable_grad() = at::Tensor();
  DataParallel ddp(store.params(), dp, DdpOptions{256, true, true});
  ddp.set_sync(true);
  (a * c * static_cast<double>(dp.rank() + 1)).sum().backward();
  ddp.finish();
  const double n = dp.size();
  EXPECT_EQ(b.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(at::allclose(a.grad(), c.detach() * (n * (n + 1) / 2)));
}

}  // namespace
}  // namespace meshtrain::test
