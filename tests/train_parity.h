// The data-parallel parity harness shared by the DDP and ZeRO tests: a tiny
// Llama trained 3 steps on a mesh against one process with the same global
// batch. Per-step losses and gradient norms within 1e-5 relative, and after 3
// AdamW steps each weight's distance from the reference, ||w - w_ref||, within
// 1e-3 of the distance the reference travelled, ||w_ref - w_init||. (Not
// element-wise: Adam divides every element's update by its own gradient scale,
// so elements whose gradient is near zero turn fp32 summation-order noise into
// differences of order lr; see test_tp_mp.cpp.) The reference splits the
// global batch into micro-batches differently and every sequence ignores a
// different number of targets: equal results show the loss is normalised by
// the global token count.
#pragma once

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/runtime/mesh.h"
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
  Batch b{data.narrow(1, 0, m.seq).contiguous(), data.narrow(1, 1, m.seq).contiguous(), {}, {}};
  for (int64_t i = 0; i < kGlobal; ++i) b.targets[i].narrow(0, 0, i).fill_(-1);
  return b;
}

std::vector<Batch> split(const Batch& b, int64_t first, int64_t count, int64_t micro) {
  std::vector<Batch> out;
  for (int64_t s = first; s < first + count; s += micro) {
    out.push_back({b.tokens.narrow(0, s, micro).contiguous(), b.targets.narrow(0, s, micro).contiguous(), {}, {}});
  }
  return out;
}

// How gradients cross the data-parallel group.
enum class Reduce { Flat, DdpOverlapped, DdpAfterBackward, Zero };

struct Sharding {
  int stage = 0;       // ZeRO stage with Reduce::Zero
  int dp_shard = 0;    // HSDP: shard within groups of this many dp ranks (0: all of dp)
  bool prefetch = true;
  bool offload = false;  // ZeRO-Offload: the optimizer's slices in (a second) host memory
};

void check(int tp_size, Reduce reduce = Reduce::Flat, plan::Recompute recompute = plan::Recompute::None,
           Sharding zs = {}) {
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
  std::unique_ptr<ShardedDataParallel> zero;
  ShardGroups groups;
  if (reduce != Reduce::Flat) {
    // Replicas that start apart: the broadcast from rank 0 must align them.
    if (dp.rank() != 0) {
      at::NoGradGuard no_grad;
      for (auto& p : model.params().params()) p.tensor.add_(0.01);
    }
  }
  if (reduce == Reduce::Zero) {
    groups = make_shard_groups(rt, dp, zs.dp_shard > 0 ? zs.dp_shard : dp.size());
    ZeroOptions zo{zs.stage, false, zs.prefetch};
    zo.offload = zs.offload;
    zero = std::make_unique<ShardedDataParallel>(model, *groups.shard, *groups.replicate, tp, o, zo);
  } else if (reduce != Reduce::Flat) {
    // Small buckets: many of them, launched in order while backward runs.
    ddp = std::make_unique<DataParallel>(model.params().params(), dp,
                                         DdpOptions{16 << 10, reduce == Reduce::DdpOverlapped, false});
    EXPECT_GT(ddp->buckets(), 4u);
  }
  AdamW opt(zero ? zero->shard_params() : model.params().params(), o), opt1(single.params().params(), o);
  TrainStep step(model, opt, dp, tp, {Precision::Fp32, nullptr, ddp.get(), zero.get()});
  TrainStep step1(single, opt1, solo_dp, solo_tp);
  std::vector<at::Tensor> init;
  for (const auto& p : single.params().params()) init.push_back(p.tensor.detach().clone());
  const int64_t per_rank = kGlobal / dp.size();
  for (int s = 0; s < 3; ++s) {
    Batch g = global_batch(spec, s);
    StepResult r = step.run(split(g, dp.rank() * per_rank, per_rank, per_rank >= 2 ? 2 : 1));
    StepResult r1 = step1.run(split(g, 0, kGlobal, 4));
    EXPECT_EQ(r.tokens, r1.tokens);
    EXPECT_NEAR(r.loss, r1.loss, 1e-5 * r1.loss)
        << "step " << s << " dp=" << dp.size() << " tp=" << tp_size << " zero=" << zs.stage;
    EXPECT_NEAR(r.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << s;
  }
  // ZeRO: the whole fp32 weights, gathered from the slices (what a checkpoint holds).
  const std::vector<at::Tensor> whole = zero ? zero->whole_weights() : std::vector<at::Tensor>{};
  const auto& ps = model.params().params();
  const auto& rs = single.params().params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor local = zero ? whole[i] : ps[i].tensor.detach();
    at::Tensor w = ps[i].tp_dim >= 0 ? gather_along(local, tp, ps[i].tp_dim) : local;
    at::Tensor w1 = rs[i].tensor.detach(), w0 = init[i];
    if (ps[i].name == "embed.weight" || ps[i].name == "head.weight") {
      w = w.narrow(0, 0, spec.vocab);
      w1 = w1.narrow(0, 0, spec.vocab);
      w0 = w0.narrow(0, 0, spec.vocab);
    }
    const double travelled = (w1 - w0).norm().item<double>(), apart = (w - w1).norm().item<double>();
    EXPECT_LE(apart, 1e-3 * travelled) << ps[i].name << " dp=" << dp.size() << " tp=" << tp_size
                                        << " zero=" << zs.stage;
  }
}

}  // namespace
}  // namespace meshtrain::test
