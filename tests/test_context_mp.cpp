// Context parallelism against one process, with cp = the world size (2, 3, 4
// in the comm_np* entries; the zig-zag layout needs nothing else of cp).
//
// Attention: every rank builds the same whole-sequence q, k, v and loss weights
// from a seed; the reference is naive causal attention over all S tokens in
// float64; the cp run gives each rank its zig-zag tokens (fp32) and checks its
// output rows and its dQ, dK, dV (the gradient of sum(out ∘ w) over all ranks)
// against the reference's rows. Tolerance: |cp - ref| <= 2e-5 x max|ref| per
// tensor (fp32 against float64: a few ulps of the logits' size; measured
// below 2e-6).
//
// Model: the Transformer with cp = world (and, on 4 ranks, tp 2 x cp 2 with
// and without sequence parallelism) against the one-process model on the same
// batch: loss within 1e-5 relative, every gradient (summed over cp, shards
// gathered over tp) within 1e-4 x max|g| + 1e-7 — the tensor-parallel parity
// tolerances (test_tp_mp.cpp), the runs differing only in summation order.
//
// Mutations seen to fail: ring attention skipping the diagonal chunk pair
// (every ring case, output and gradients); positions not global under cp
// (the model's loss and gradients, for every implementation).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/parallel/context/attention.h"
#include "meshtrain/parallel/context/ring_attention.h"
#include "meshtrain/parallel/context/zigzag.h"
#include "meshtrain/runtime/mesh.h"
#include "tests/mp.h"
#include "tests/parity.h"

namespace meshtrain::test {
namespace {

constexpr plan::CpImpl kImpls[] = {plan::CpImpl::Ring, plan::CpImpl::Ulysses, plan::CpImpl::AllGather};

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want).abs().max().item<double>() / std::max(scale, 1e-30);
}

// hq 12 divides by cp 2, 3, 4 (Ulysses); hkv 2 does not by 3 or 4 (kv heads repeated).
void check_attention(plan::CpImpl impl, int64_t hq, int64_t hkv, int64_t chunk, const nn::TiledAttentionOptions& tiles,
                     bool naive_core) {
  Comm& cp = runtime().world();
  const int n = cp.size();
  const int64_t b = 2, d = 8, S = 2 * n * chunk;
  const std::string what = fmt::format("{} cp={} hq={} hkv={} S={} tiles={}x{} core={}", plan::to_string(impl), n, hq,
                                       hkv, S, tiles.block_q, tiles.block_k, naive_core ? "naive" : "tiled");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = (at::randn({b, hq, S, d}, gen, f64) * 2).requires_grad_();  // logits of a few units
  at::Tensor k = (at::randn({b, hkv, S, d}, gen, f64) * 2).requires_grad_();
  at::Tensor v = at::randn({b, hkv, S, d}, gen, f64).requires_grad_();
  const at::Tensor w = at::randn({b, hq, S, d}, gen, f64);
  at::Tensor ref = nn::causal_attention(q, k, v);
  (ref * w).sum().backward();

  const ZigZag z(S, n, cp.rank());
  auto local = [&](const at::Tensor& x) { return z.shard(x.detach(), 2).to(at::kFloat).contiguous().requires_grad_(); };
  at::Tensor ql = local(q), kl = local(k), vl = local(v);
  AttentionCore core = [&](const at::Tensor& a, const at::Tensor& bb, const at::Tensor& c) {
    return naive_core ? nn::causal_attention(a, bb, c) : nn::tiled_attention(a, bb, c, {}, tiles);
  };
  at::Tensor out = impl == plan::CpImpl::Ring ? ring_attention(ql, kl, vl, cp, tiles)
                                              : context_attention(ql, kl, vl, cp, impl, core);
  (out * z.shard(w, 2).to(at::kFloat)).sum().backward();
  EXPECT_LE(rel_err(out, z.shard(ref.detach(), 2)), 2e-5) << what << ": output";
  EXPECT_LE(rel_err(ql.grad(), z.shard(q.grad(), 2)), 2e-5) << what << ": dQ";
  EXPECT_LE(rel_err(kl.grad(), z.shard(k.grad(), 2)), 2e-5) << what << ": dK";
  EXPECT_LE(rel_err(vl.grad(), z.shard(v.grad(), 2)), 2e-5) << what << ": dV";
}

TEST(ContextParallel, AttentionMatchesOneProcess) {
  for (plan::CpImpl impl : kImpls) {
    for (bool naive : {false, true}) {
      check_attention(impl, 12, 2, 5, {4, 3}, naive);     // GQA, tiles that do not divide the chunk
      check_attention(impl, 12, 12, 8, {512, 512}, naive);  // MHA, one tile per chunk
      check_attention(impl, 12, 1, 3, {2, 2}, naive);     // MQA
    }
  }
}

// Ring attention's blocks really travel: every rank receives cp - 1 K/V blocks
// forward and cp - 1 K/V plus cp dK/dV backward.
TEST(ContextParallel, RingSendsTheBlocksItMust) {
  Comm& cp = runtime().world();
  const int n = cp.size();
  if (n == 1) GTEST_SKIP() << "needs cp > 1";
  const int64_t S = 2 * n * 4;
  at::Tensor q = at::randn({1, 2, S / n, 8}).requires_grad_(), k = at::randn({1, 2, S / n, 8}).requires_grad_(),
             v = at::randn({1, 2, S / n, 8}).requires_grad_();
  ring_stats() = {};
  cp.reset_stats();
  ring_attention(q, k, v, cp).sum().backward();
  EXPECT_EQ(ring_stats().hops, 3 * (n - 1) + 1);
  const auto& s = cp.stats();
  ASSERT_TRUE(s.count("send"));
  // K and V: 2 x [1, 2, S/n, 8] fp32 per hop, dK/dV the same size.
  const uint64_t block = 2 * 2 * (S / n) * 8 * 4;
  EXPECT_EQ(s.at("send").calls, static_cast<uint64_t>(3 * (n - 1) + 1));
  EXPECT_EQ(s.at("send").bytes, block * static_cast<uint64_t>(3 * (n - 1) + 1));
}

plan::ModelSpec tiny(bool llama) {
  plan::ModelSpec m = plan::preset(llama ? "llama-tiny" : "gpt-tiny");
  m.name = "cp-test";
  m.vocab = 100;
  m.seq = 48;  // 2 x cp x 6 for cp in 2, 3, 4 (and 2 x 2 x 2 x 6 for tp 2 x cp 2 with SP)
  m.layers = 2;
  m.hidden = 96;
  m.heads = 12;
  m.kv_heads = llama ? 4 : 12;  // GQA; Ulysses repeats kv heads at cp 3
  m.ffn = 128;
  m.dropout = 0.0;
  return m;
}

TokenBatch data(const plan::ModelSpec& m) { return random_batch(m, 1, 5); }

// The model on tp x cp = the world against one process.
void check_model(const plan::ModelSpec& spec, plan::CpImpl impl, Comm& tp, Comm& cp, Comm& world, bool sp) {
  const std::string what = fmt::format("{} attention={} {} tp={} cp={} sp={}", spec.position == plan::Position::RoPE
                                           ? "llama" : "gpt",
                                       plan::attention_name(spec.attention), plan::to_string(impl), tp.size(),
                                       cp.size(), sp);
  Comm solo("solo", runtime().rank());
  plan::ModelSpec one = spec;
  one.attention = plan::AttentionImpl::Naive;
  Transformer single(one, solo, false, 4321);
  Transformer parallel(spec, tp, sp, 4321);
  parallel.set_context_parallel(cp, impl);
  const TokenBatch d = data(spec);
  at::Tensor ref = single.forward(d.tokens, d.targets).sum() / d.count;
  ref.backward();
  const ZigZag z(spec.seq, cp.size(), cp.rank());
  at::Tensor loss = parallel.forward(z.shard(d.tokens, 1).contiguous(), z.shard(d.targets, 1).contiguous()).sum() /
                    d.count;
  loss.backward();
  parallel.finalize_grads();
  at::Tensor total = loss.detach().reshape({1}).clone();
  cp.all_reduce(total);  // each cp rank holds its tokens' share of the loss
  EXPECT_NEAR(total.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>())) << what;
  const auto& ps = parallel.params().params();
  const auto& rs = single.params().params();
  ASSERT_EQ(ps.size(), rs.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor g = ps[i].tensor.grad();
    ASSERT_TRUE(g.defined()) << what << " " << ps[i].name;
    g = g.clone();
    cp.all_reduce(g);  // weights are replicated over cp: their gradients sum (the dp x cp reduction)
    if (ps[i].tp_dim >= 0) g = gather_along(g, tp, ps[i].tp_dim);
    expect_grad_parity(g, rs[i].tensor.grad(), ps[i].name, spec.vocab, what);
  }
  (void)world;
}

TEST(ContextParallel, ModelMatchesOneProcess) {
  Comm& world = runtime().world();
  Comm solo_tp("tp-solo", runtime().rank());
  for (plan::CpImpl impl : kImpls) {
    for (bool llama : {true, false}) {
      plan::ModelSpec m = tiny(llama);
      m.attention = llama ? plan::AttentionImpl::Tiled : plan::AttentionImpl::Naive;
      check_model(m, impl, solo_tp, world, world, false);
    }
  }
}

TEST(ContextParallel, WithTensorParallelMatchesOneProcess) {
  Runtime& rt = runtime();
  if (rt.world_size() != 4) GTEST_SKIP() << "tp 2 x cp 2 needs 4 ranks";
  DeviceMesh mesh(rt, MeshLayout::create(4, {{"tp", 2}, {"cp", 2}}));
  for (plan::CpImpl impl : kImpls) {
    for (bool sp : {false, true}) check_model(tiny(true), impl, mesh.axis("tp"), mesh.axis("cp"), mesh.world(), sp);
  }
}

TEST(ContextParallel, RefusesWhatItCannotSplit) {
  Comm& cp = runtime().world();
  if (cp.size() < 2) GTEST_SKIP() << "needs cp > 1";
  Comm solo("solo", runtime().rank());
  plan::ModelSpec m = tiny(true);
  m.heads = 2 * cp.size() + 1;  // not divisible by cp
  m.kv_heads = 1;
  m.hidden = 8 * m.heads;
  Transformer model(m, solo, false, 1);
  try {
    model.set_context_parallel(cp, plan::CpImpl::Ulysses);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ulysses"), std::string::npos) << e.what();
  }
  plan::ModelSpec drop = tiny(true);
  drop.dropout = 0.1;
  Transformer with_dropout(drop, solo, false, 1);
  EXPECT_THROW(with_dropout.set_context_parallel(cp, plan::CpImpl::Ring), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain::test
