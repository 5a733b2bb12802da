// Expert parallelism (moe/layer.h) against one process: a tiny MoE Llama (a
// MoE layer with a shared expert, then a dense layer) trained 3 steps with its
// experts split across ep ranks, against the whole model in one process with
// the same global batch cut into the same micro-batches (each micro-batch's
// router losses and capacity depend on its own tokens, so the split must
// match). Per step the loss, gradient norm, router losses and tokens per
// expert; after the first step every gradient (experts gathered over ep,
// tp-split ones over tp) within 1e-5 of the reference's norm; after 3 AdamW
// steps each weight's distance from the reference within 1e-3 of the distance
// the reference travelled (train_parity.h says why not element-wise).
// Gradients cross the replicas as flat all-reduces, two DDPs (dense over
// dp x ep, experts over dp) or ZeRO-1/3 (experts in flats of their own).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/moe/layer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/parallel/pipeline/executor.h"
#include "meshtrain/train/pipeline_step.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/train/step.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

constexpr int64_t kGlobal = 8;

plan::ModelSpec moe_spec(double capacity_factor) {
  plan::ModelSpec m = plan::preset("moe-tiny");
  m.vocab = 100;
  m.seq = 16;
  m.layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 48;
  m.experts = 8;
  m.top_k = 2;
  m.expert_ffn = 16;
  m.moe_every = 2;  // layer 0 MoE, layer 1 dense
  m.shared_experts = 1;
  m.capacity_factor = capacity_factor;
  m.aux_loss_coef = 0.01;
  m.z_loss_coef = 0.001;
  m.dropout = 0;
  return m;
}

// Sequence i ignores its first i targets.
Batch sequence(const plan::ModelSpec& m, int step, int64_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  at::Tensor data = at::randint(m.vocab, {kGlobal, m.seq + 1}, gen, at::kLong).narrow(0, i, 1);
  Batch b{data.narrow(1, 0, m.seq).clone(), data.narrow(1, 1, m.seq).clone(), {}, {}};  // one row: views otherwise
  b.targets.narrow(1, 0, i).fill_(-1);
  return b;
}

// Sequences [first, first + count) as micro-batches of one.
std::vector<Batch> micro_batches(const plan::ModelSpec& m, int step, int64_t first, int64_t count) {
  std::vector<Batch> out;
  for (int64_t i = first; i < first + count; ++i) out.push_back(sequence(m, step, i));
  return out;
}

at::Tensor whole(const Param& p, const at::Tensor& local, Comm& tp, Comm& ep, int64_t vocab) {
  at::Tensor t = local;
  if (p.expert) t = gather_along(t, ep, 0);
  if (p.tp_dim >= 0) t = gather_along(t, tp, p.tp_dim);
  if (p.name == "embed.weight" || p.name == "head.weight") t = t.narrow(0, 0, vocab);
  return t;
}

double stat(const StepResult& r, const std::string& name) {
  for (const auto& [n, v] : r.metrics)
    if (n == name) return v;
  ADD_FAILURE() << "no metric " << name;
  return 0;
}

// How gradients cross the replicas: one flat all-reduce per kind, two DDPs, or ZeRO.
enum class Reduce { Flat, Ddp, Zero1, Zero3 };

void check(int tp_size, int ep_size, Reduce reduce, double capacity_factor = 0) {
  Runtime& rt = runtime();
  DeviceMesh mesh(rt, MeshLayout::create(rt.world_size(), {{"tp", tp_size}, {"ep", ep_size}}),
                  {{"dp", "cp"}, {"dp", "cp", "ep"}, {"dp", "ep"}});
  Comm& tp = mesh.axis("tp");
  Comm& ep = mesh.axis("ep");
  Comm& dense = mesh.group({"dp", "cp", "ep"});
  Comm& expert_dp = mesh.group({"dp", "cp"});
  Comm& data = mesh.group({"dp", "ep"});
  const plan::ModelSpec spec = moe_spec(capacity_factor);
  Comm solo_tp("solo", rt.rank()), solo_dp("solo", rt.rank());
  Transformer model(spec, tp, tp_size > 1, 5, {}, &ep), single(spec, solo_tp, false, 5);
  AdamWOptions o;
  o.lr = 1e-2;
  o.warmup_steps = 1;
  o.total_steps = 3;
  std::vector<Param> dense_params, expert_params;
  for (const auto& p : model.params().params()) (p.expert ? expert_params : dense_params).push_back(p);
  std::unique_ptr<DataParallel> ddp_dense, ddp_experts;
  std::unique_ptr<ShardedDataParallel> zero;
  Comm solo_replicas("solo", rt.rank());
  if (reduce == Reduce::Zero1 || reduce == Reduce::Zero3) {
    zero = std::make_unique<ShardedDataParallel>(
        model, dense, solo_replicas, tp, o,
        ZeroOptions{reduce == Reduce::Zero1 ? 1 : 3, false, true, false, &expert_dp});
  }
  if (reduce == Reduce::Ddp) {
    ddp_dense = std::make_unique<DataParallel>(dense_params, dense, DdpOptions{16 << 10, true, false});
    if (expert_dp.size() > 1) {
      ddp_experts = std::make_unique<DataParallel>(expert_params, expert_dp, DdpOptions{16 << 10, true, false});
    }
  }
  AdamW opt(zero ? zero->shard_params() : model.params().params(), o), opt1(single.params().params(), o);
  if (!zero) opt.set_expert_group(&ep);  // ZeRO's slices are disjoint over its shard group (zero.h)
  StepOptions so{Precision::Fp32, nullptr, ddp_dense.get(), zero.get(), nullptr};
  so.expert_dp = &expert_dp;
  so.ddp_experts = ddp_experts.get();
  TrainStep step(model, opt, dense, tp, so);
  TrainStep step1(single, opt1, solo_dp, solo_tp);
  std::vector<at::Tensor> init;
  for (const auto& p : single.params().params()) init.push_back(p.tensor.detach().clone());
  const int64_t mine = kGlobal / data.size();
  const std::string where = fmt::format("tp={} ep={} dp={} capacity={} reduce={}", tp_size, ep_size,
                                        mesh.size("dp"), capacity_factor, static_cast<int>(reduce));
  const auto& ps = model.params().params();
  const auto& rs = single.params().params();
  for (int s = 0; s < 3; ++s) {
    StepResult r = step.run(micro_batches(spec, s, data.rank() * mine, mine));
    StepResult r1 = step1.run(micro_batches(spec, s, 0, kGlobal));
    EXPECT_EQ(r.tokens, r1.tokens);
    EXPECT_NEAR(r.loss, r1.loss, 1e-5 * r1.loss) << "step " << s << " " << where;
    EXPECT_NEAR(r.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << s << " " << where;
    for (const char* m : {"moe_aux", "moe_z", "moe_imbalance", "moe_dropped"}) {
      EXPECT_NEAR(stat(r, m), stat(r1, m), 1e-5 * std::abs(stat(r1, m)) + 1e-12) << m << " step " << s << " " << where;
    }
    EXPECT_EQ(r.expert_tokens, r1.expert_tokens) << "step " << s << " " << where;
    if (capacity_factor > 0 && s == 0) EXPECT_GT(stat(r1, "moe_dropped"), 0) << "the capacity must drop some";
    if (s > 0 || zero) continue;  // (ZeRO keeps reduced gradients as slices: compared through the weights)
    for (size_t i = 0; i < ps.size(); ++i) {  // every gradient of the first step
      ASSERT_EQ(ps[i].name, rs[i].name);
      const at::Tensor g = whole(ps[i], ps[i].tensor.grad(), tp, ep, spec.vocab);
      const at::Tensor g1 = whole(rs[i], rs[i].tensor.grad(), solo_tp, solo_tp, spec.vocab);
      ASSERT_EQ(g.sizes(), g1.sizes()) << ps[i].name;
      EXPECT_LE((g - g1).norm().item<double>(), 1e-5 * g1.norm().item<double>() + 1e-10)
          << ps[i].name << " " << where;
    }
  }
  const std::vector<at::Tensor> gathered = zero ? zero->whole_weights() : std::vector<at::Tensor>{};
  for (size_t i = 0; i < ps.size(); ++i) {
    const at::Tensor w = whole(ps[i], zero ? gathered[i] : ps[i].tensor.detach(), tp, ep, spec.vocab);
    const at::Tensor w1 = whole(rs[i], rs[i].tensor.detach(), solo_tp, solo_tp, spec.vocab);
    const at::Tensor w0 = whole(rs[i], init[i], solo_tp, solo_tp, spec.vocab);
    const double travelled = (w1 - w0).norm().item<double>(), apart = (w - w1).norm().item<double>();
    EXPECT_LE(apart, 1e-3 * travelled) << ps[i].name << " " << where;
  }
}

// Pipeline stages (1F1B over 2 stages, each holding one MoE layer of 4 layers)
// with experts split across `ep_size` ranks: the router losses of every
// stage's layer reach the gradient through the schedule's backward.
void check_pipeline(int ep_size) {
  Runtime& rt = runtime();
  const MeshLayout layout = MeshLayout::create(rt.world_size(), {{"ep", ep_size}, {"pp", 2}});
  DeviceMesh mesh(rt, layout, {{"dp", "cp"}, {"dp", "cp", "ep"}, {"dp", "ep"}});
  Comm& tp = mesh.axis("tp");
  Comm& pp = mesh.axis("pp");
  Comm& ep = mesh.axis("ep");
  Comm& dense = mesh.group({"dp", "cp", "ep"});
  Comm& expert_dp = mesh.group({"dp", "cp"});
  Comm& data = mesh.group({"dp", "ep"});
  plan::ModelSpec spec = moe_spec(0);
  spec.layers = 4;  // MoE layers 0 and 2: one per stage
  Comm solo("solo", rt.rank());
  Transformer single(spec, solo, false, 5);
  auto owned = build_stages(spec, tp, false, 5, pp.rank(), pp.size(), 1, {2, 2}, plan::Balance::Parameters, &ep);
  std::vector<Transformer*> chunks;
  for (auto& c : owned) chunks.push_back(c.get());
  std::unique_ptr<Comm> embed = make_embedding_group(rt, layout);
  const int64_t mine = kGlobal / data.size();
  PipelineExecutor exec(plan::build_schedule(plan::Schedule::OneFOneB, 2, static_cast<int>(mine), 1), chunks, pp,
                        {spec.seq, 1, spec.hidden}, embed.get());
  AdamWOptions o;
  o.lr = 1e-2;
  o.warmup_steps = 1;
  o.total_steps = 3;
  std::vector<Param> updated = pipeline_params(chunks);
  AdamW opt(updated, o), opt1(single.params().params(), o);
  opt.set_expert_group(&ep);
  PipelineTrainStep step(chunks, exec, opt, dense, tp, pp, {}, Precision::Fp32, &expert_dp);
  TrainStep step1(single, opt1, solo, solo);
  std::map<std::string, at::Tensor> init;
  for (const auto& p : single.params().params()) init[p.name] = p.tensor.detach().clone();
  for (int s = 0; s < 3; ++s) {
    const StepResult r = step.run(micro_batches(spec, s, data.rank() * mine, mine));
    const StepResult r1 = step1.run(micro_batches(spec, s, 0, kGlobal));
    EXPECT_NEAR(r.loss, r1.loss, 1e-5 * r1.loss) << "step " << s << " ep " << ep_size;
    EXPECT_NEAR(r.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << s << " ep " << ep_size;
    for (const char* m : {"moe_aux", "moe_z", "moe_imbalance"}) {
      EXPECT_NEAR(stat(r, m), stat(r1, m), 1e-5 * std::abs(stat(r1, m))) << m << " step " << s << " ep " << ep_size;
    }
    EXPECT_EQ(r.expert_tokens, r1.expert_tokens) << "step " << s << " ep " << ep_size;
  }
  std::map<std::string, Param> ref;
  for (const auto& p : single.params().params()) ref[p.name] = p;
  for (Transformer* c : chunks) {
    for (const auto& p : c->params().params()) {
      const Param& q = ref.at(p.name);
      const at::Tensor w = whole(p, p.tensor.detach(), tp, ep, spec.vocab);
      const at::Tensor w1 = whole(q, q.tensor.detach(), solo, solo, spec.vocab);
      const at::Tensor w0 = whole(q, init.at(p.name), solo, solo, spec.vocab);
      const double travelled = (w1 - w0).norm().item<double>(), apart = (w - w1).norm().item<double>();
      EXPECT_LE(apart, 1e-3 * travelled) << p.name << " ep " << ep_size;
    }
  }
}

TEST(MoeParallel, PipelineStagesWithExpertParallelEqualOneProcess) {
  const int w = runtime().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "pp2 (x ep2) needs 2 or 4 ranks";
  check_pipeline(w / 2);
}

// A router that sends every token to the experts of ep rank 0 (x > 0, the
// other experts' router rows 0): the other ranks' experts get no rows, yet
// every rank makes every exchange, forward and backward (their all-to-alls
// would fall out of step otherwise), and the layer equals the whole one.
TEST(MoeParallel, ExpertsThatGetNoTokensStillExchange) {
  Runtime& rt = runtime();
  if (rt.world_size() != 2 && rt.world_size() != 4) GTEST_SKIP() << "ep 2 or 4";
  Comm& ep = rt.world();
  plan::ModelSpec spec = moe_spec(0);
  spec.experts = 2 * ep.size();
  spec.top_k = 2;
  ParamStore mine(7, 0, 1), all(7, 0, 1);
  MoeLayer split(mine, "l", spec, &ep, nullptr), whole(all, "l", spec, nullptr, nullptr);
  at::NoGradGuard no_grad;
  for (MoeLayer* l : {&split, &whole}) {
    at::Tensor r = l->router_weight().detach();
    r.narrow(0, 0, 2).abs_();
    r.narrow(0, 2, r.size(0) - 2).zero_();
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(40 + rt.rank());
  const at::Tensor x = at::rand({6, 1, spec.hidden}, gen) + 0.1, probe = at::randn({6, 1, spec.hidden}, gen);
  for (int pass = 0; pass < 3; ++pass) {  // a few passes: the ranks must stay in step
    at::AutoGradMode grad(true);
    at::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    (split.forward(xa, 1.0) * probe).sum().backward();
    (whole.forward(xb, 1.0) * probe).sum().backward();
    EXPECT_TRUE(at::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6)) << "pass " << pass;
  }
  double kept_here = 0;
  for (double t : split.stats().tokens) kept_here += t;
  EXPECT_EQ(kept_here, 3 * 6 * 2);
  EXPECT_EQ(split.stats().tokens[2], 0);  // experts 0 and 1 took every token
}

// The ep group's byte counters (comm.h's moved_bytes: what the transport
// actually moved) equal the formula plan/traffic.h uses, from the rows the
// layer routed to and from other ranks: per forward the counts (E / ep int64
// from each peer) and the dispatch and combine rows, h fp32 wide, and the
// rows again in backward.
TEST(MoeParallel, AllToAllByteCountersEqualTheFormula) {
  Runtime& rt = runtime();
  if (rt.world_size() < 2) GTEST_SKIP() << "ep > 1";
  std::vector<int> all;
  for (int r = 0; r < rt.world_size(); ++r) all.push_back(r);
  for (const char* transport : {"1", "0"}) {  // shared memory, then Gloo
    setenv("MESHTRAIN_SHM", transport, 1);
    std::unique_ptr<Comm> ep = rt.new_group(all, std::string("ep_bytes_") + transport);
    plan::ModelSpec spec = moe_spec(0);
    spec.experts = 2 * ep->size();
    ParamStore store(3, 0, 1);
    MoeLayer layer(store, "l", spec, ep.get(), nullptr);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9 + rt.rank());
    const at::Tensor x = at::randn({5 + rt.rank(), 2, spec.hidden}, gen).requires_grad_(true);
    ep->reset_stats();
    (layer.forward(x, 1.0) * x.detach()).sum().backward();
    { at::NoGradGuard no_grad; (void)layer.forward(x, 0.0); }  // an evaluation forward: no backward exchanges
    unsetenv("MESHTRAIN_SHM");  // (read when the group first needs shared memory)
    EXPECT_EQ(ep->shm_available(), std::string(transport) == "1");
    uint64_t moved = 0;
    for (const auto& [op, st] : ep->stats()) moved += st.moved_bytes;
    const auto& e = layer.exchanges();
    EXPECT_EQ(e.forwards, 2);
    EXPECT_EQ(e.backwards, 1);
    const double n = ep->size();
    const double want = e.forwards * (n - 1) / n * spec.experts * 8 +
                        static_cast<double>(e.rows_forward + e.rows_backward) * spec.hidden * 4;
    EXPECT_EQ(static_cast<double>(moved), want) << "MESHTRAIN_SHM=" << transport << " rows " << e.rows_forward << "+" << e.rows_backward << [&] { std::string o; for (const auto& [op, st] : ep->stats()) o += " " + op + ":" + std::to_string(st.calls) + "/" + std::to_string(st.moved_bytes); return o; }();
    EXPECT_GT(e.rows_forward, 0);
  }
}

TEST(MoeParallel, ExpertParallelDroplessEqualsOneProcess) {
  const int w = runtime().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "ep = world needs 2 or 4 ranks";
  check(1, w, Reduce::Flat);
}

TEST(MoeParallel, ExpertParallelWithDataParallelEqualsOneProcess) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "ep2 x dp2 needs 4 ranks";
  check(1, 2, Reduce::Ddp);
}

TEST(MoeParallel, ExpertParallelWithZeroEqualsOneProcess) {
  const int w = runtime().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "ep2 x dp (1 or 2) needs 2 or 4 ranks";
  check(1, 2, Reduce::Zero1);
  check(1, 2, Reduce::Zero3);
}

TEST(MoeParallel, CapacityDroppingUnderExpertParallelEqualsOneProcess) {
  if (runtime().world_size() != 2) GTEST_SKIP() << "ep2 needs 2 ranks";
  check(1, 2, Reduce::Flat, 1.0);
}

// Named Mesh* to run in the 8-rank entry (mesh_np8).
TEST(MeshMoe, ExpertTensorAndDataParallelEqualOneProcess) {
  if (runtime().world_size() != 8) GTEST_SKIP() << "ep2 x tp2 x dp2 needs 8 ranks";
  check(2, 2, Reduce::Ddp);
}

}  // namespace
}  // namespace meshtrain::test
