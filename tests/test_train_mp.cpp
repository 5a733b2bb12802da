// Training steps under data parallelism (and dp x tp) against one process with
// the same global batch: per-step losses and gradient norms within 1e-5
// relative, and after 3 AdamW steps each weight's distance from the reference,
// ||w - w_ref||, within 1e-3 of the distance the reference travelled,
// ||w_ref - w_init||. (Not element-wise: Adam divides every element's update by
// its own gradient scale, so elements whose gradient is near zero turn fp32
// summation-order noise into differences of order lr; see test_tp_mp.cpp.)
// The reference splits the global batch into micro-batches differently and
// every sequence ignores a different number of targets: equal results show the
// loss is normalised by the global token count.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/step.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

constexpr int64_t kGlobal = 8;

plan::ModelSpec model_spec() {
  plan::ModelSpec m = plan::preset("llama-tiny");
  m.vocab = 100;
  m.seq = 16;
  m.layers = 2;
  m.hidden = 64;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn = 96;
  return m;
}

// The global batch of a step: kGlobal sequences; sequence i ignores its first i targets.
Batch global_batch(const plan::ModelSpec& m, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  at::Tensor data = at::randint(m.vocab, {kGlobal, m.seq + 1}, gen, at::kLong);
  Batch b{data.narrow(1, 0, m.seq).contiguous(), data.narrow(1, 1, m.seq).contiguous(), {}};
  for (int64_t i = 0; i < kGlobal; ++i) b.targets[i].narrow(0, 0, i).fill_(-1);
  return b;
}

std::vector<Batch> split(const Batch& b, int64_t first, int64_t count, int64_t micro) {
  std::vector<Batch> out;
  for (int64_t s = first; s < first + count; s += micro) {
    out.push_back({b.tokens.narrow(0, s, micro).contiguous(), b.targets.narrow(0, s, micro).contiguous(), {}});
  }
  return out;
}

// How gradients cross the data-parallel group.
enum class Reduce { Flat, DdpOverlapped, DdpAfterBackward };

void check(int tp_size, Reduce reduce = Reduce::Flat, plan::Recompute recompute = plan::Recompute::None) {
  Runtime& rt = runtime();
  DeviceMesh mesh(rt, MeshLayout::create(rt.world_size(), {{"tp", tp_size}}));
  Comm& tp = mesh.axis("tp");
  Comm& dp = mesh.group({"dp", "cp"});
  const plan::ModelSpec spec = model_spec();
  Comm solo_tp("solo", rt.rank()), solo_dp("solo", rt.rank());
  Transformer model(spec, tp, tp_size > 1, 5), single(spec, solo_tp, false, 5);
  AdamWOptions o;
  o.lr = 1e-2;
  o.warmup_steps = 1;
  o.total_steps = 3;
  model.set_recompute(recompute);  // reentrant backward: DDP's hooks fire inside it
  std::unique_ptr<DataParallel> ddp;
  if (reduce != Reduce::Flat) {
    // Replicas that start apart: DDP's broadcast from rank 0 must align them.
    if (dp.rank() != 0) {
      at::NoGradGuard no_grad;
      for (auto& p : model.params().params()) p.tensor.add_(0.01);
    }
    // Small buckets: many of them, launched in order while backward runs.
    ddp = std::make_unique<DataParallel>(model.params().params(), dp,
                                         DdpOptions{16 << 10, reduce == Reduce::DdpOverlapped, false});
    EXPECT_GT(ddp->buckets(), 4u);
  }
  AdamW opt(model.params().params(), o), opt1(single.params().params(), o);
  TrainStep step(model, opt, dp, tp, {Precision::Fp32, nullptr, ddp.get()}), step1(single, opt1, solo_dp, solo_tp);
  std::vector<at::Tensor> init;
  for (const auto& p : single.params().params()) init.push_back(p.tensor.detach().clone());
  const int64_t per_rank = kGlobal / dp.size();
  for (int s = 0; s < 3; ++s) {
    Batch g = global_batch(spec, s);
    StepResult r = step.run(split(g, dp.rank() * per_rank, per_rank, per_rank >= 2 ? 2 : 1));
    StepResult r1 = step1.run(split(g, 0, kGlobal, 4));
    EXPECT_EQ(r.tokens, r1.tokens);
    EXPECT_NEAR(r.loss, r1.loss, 1e-5 * r1.loss) << "step " << s << " dp=" << dp.size() << " tp=" << tp_size;
    EXPECT_NEAR(r.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << s;
  }
  const auto& ps = model.params().params();
  const auto& rs = single.params().params();
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor w = ps[i].tp_dim >= 0 ? gather_along(ps[i].tensor.detach(), tp, ps[i].tp_dim) : ps[i].tensor.detach();
    at::Tensor w1 = rs[i].tensor.detach(), w0 = init[i];
    if (ps[i].name == "embed.weight" || ps[i].name == "head.weight") {
      w = w.narrow(0, 0, spec.vocab);
      w1 = w1.narrow(0, 0, spec.vocab);
      w0 = w0.narrow(0, 0, spec.vocab);
    }
    const double travelled = (w1 - w0).norm().item<double>(), apart = (w - w1).norm().item<double>();
    EXPECT_LE(apart, 1e-3 * travelled) << ps[i].name << " dp=" << dp.size() << " tp=" << tp_size;
  }
}

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
  if (dp.size() == 1) GTEST_SKIP();
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
// of Adam moments (the 16Ψ of the formula table), plus 4Ψ of DDP buckets.
TEST(Ddp, MeasuredMemoryMatchesTheFormula) {
  DdpReplica r;
  r.run(kGlobal / runtime().world_size());
  const MemoryUse m = measure_memory(r.model.params().params(), r.opt, &r.ddp);
  const double psi = r.psi();
  EXPECT_NEAR(static_cast<double>(m.state()), 16 * psi, 0.05 * 16 * psi);
  EXPECT_EQ(m.params, static_cast<int64_t>(4 * psi));
  EXPECT_EQ(m.optimizer, static_cast<int64_t>(8 * psi));
  EXPECT_EQ(m.buffers, static_cast<int64_t>(4 * psi));
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
