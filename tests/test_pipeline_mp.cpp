// Pipeline parallelism against one process: every schedule (GPipe, 1F1B,
// interleaved 1F1B, ZB-H1 with its split backward) on pp = world ranks, with M = p and 2p
// micro-batches: the loss and every parameter's gradient equal those of the
// whole model run on the same global batch in one process.
//
// Tolerance (fp32): |g - g_ref| <= 1e-5 * max|g_ref| + 1e-7 per tensor. The
// pipeline runs the same kernels on the same micro-batches; only the order in
// which micro-batch gradients are accumulated can differ.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <map>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/parallel/pipeline/executor.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

plan::ModelSpec spec(bool tied) {
  plan::ModelSpec m = plan::preset(tied ? "gpt-tiny" : "llama-tiny");
  m.vocab = 100;
  m.seq = 16;
  m.layers = 8;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = tied ? 4 : 2;
  m.ffn = 64;
  m.dropout = 0;
  return m;
}

std::vector<Batch> micro_batches(const plan::ModelSpec& m, int count, int64_t mb) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) {
    at::Tensor d = at::randint(m.vocab, {mb, m.seq + 1}, gen, at::kLong);
    Batch b{d.narrow(1, 0, m.seq).contiguous(), d.narrow(1, 1, m.seq).contiguous(), {}, {}};
    b.targets[0].narrow(0, 0, i % 3).fill_(-1);  // micro-batches ignore different numbers of targets
    out.push_back(b);
  }
  return out;
}

void check(plan::Schedule kind, int m, int v, bool tied, plan::Recompute recompute = plan::Recompute::None) {
  Runtime& rt = runtime();
  Comm& pp = rt.world();
  const int P = pp.size();
  SCOPED_TRACE(::testing::Message() << plan::to_string(kind) << " pp " << P << " m " << m << " v " << v
                                    << (tied ? " tied" : " untied"));
  const plan::ModelSpec sp = spec(tied);
  const int64_t mb = 2;
  const auto micro = micro_batches(sp, m, mb);
  double tokens = 0;
  for (const auto& b : micro) tokens += (b.targets >= 0).sum().item<double>();
  // Reference: the whole model, one process, the same micro-batches.
  Comm solo("solo", rt.rank());
  Transformer whole(sp, solo, false, 9);
  double ref_loss = 0;
  for (const auto& b : micro) {
    at::Tensor l = whole.forward(b.tokens, b.targets).sum() / tokens;
    l.backward();
    ref_loss += l.item<double>();
  }
  std::map<std::string, at::Tensor> ref;
  for (const auto& p : whole.params().params()) ref[p.name] = p.tensor.grad();
  // The pipeline: this rank's v chunks.
  auto chunks = build_stages(sp, solo, false, 9, rt.rank(), P, v);
  std::vector<Transformer*> raw;
  for (auto& c : chunks) {
    c->set_recompute(recompute);
    raw.push_back(c.get());
  }
  std::unique_ptr<Comm> embed;
  if (tied && P > 1 && (rt.rank() == 0 || rt.rank() == P - 1)) embed = rt.new_group({0, P - 1}, "embed");
  PipelineExecutor exec(plan::build_schedule(kind, P, m, v), raw, pp, {sp.seq, mb, sp.hidden}, embed.get());
  const double loss = exec.run(micro, tokens);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * ref_loss);
  for (Transformer* c : raw) {
    for (const auto& p : c->params().params()) {
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      const at::Tensor& g_ref = ref.at(p.name);
      const double tol = 1e-5 * g_ref.abs().max().item<double>() + 1e-7;
      EXPECT_LE((p.tensor.grad() - g_ref).abs().max().item<double>(), tol) << p.name;
    }
  }
}

TEST(Pipeline, EveryScheduleMatchesOneProcess) {
  const int P = runtime().world_size();
  if (P != 2 && P != 4) GTEST_SKIP() << "pp 2 or 4";
  for (int m : {P, 2 * P}) {
    for (bool tied : {false, true}) {
      check(plan::Schedule::GPipe, m, 1, tied);
      check(plan::Schedule::OneFOneB, m, 1, tied);
      check(plan::Schedule::Interleaved, m, 2, tied);
      check(plan::Schedule::ZBH1, m, 1, tied);
    }
  }
  // Recomputation re-runs a block's forward inside B: those linears compute dW there.
  check(plan::Schedule::ZBH1, 2 * P, 1, true, plan::Recompute::Full);
  check(plan::Schedule::ZBH1, 2 * P, 1, false, plan::Recompute::Selective);
}

// ZB-H1's W pass does the linears' weight gradients: after B alone they are
// missing, after W present (the deferral is real, not a re-walk of the graph).
TEST(Pipeline, SplitBackwardDefersTheLinearsWeightGradients) {
  Comm solo("solo", runtime().rank());
  plan::ModelSpec m = spec(false);
  Transformer model(m, solo, false, 9);
  const auto micro = micro_batches(m, 1, 2);
  nn::WeightGradStash stash;
  at::Tensor loss;
  {
    nn::DeferWeightGrads defer;
    loss = model.forward(micro[0].tokens, micro[0].targets).sum();
  }
  {
    nn::WeightGradTarget target(&stash);
    loss.backward();
  }
  const Param& q = model.params().find("layers.0.attn.q.weight");
  const Param& n = model.params().find("layers.0.norm1.weight");
  EXPECT_FALSE(q.tensor.grad().defined());
  EXPECT_TRUE(n.tensor.grad().defined());
  EXPECT_FALSE(stash.empty());
  stash.run();
  ASSERT_TRUE(q.tensor.grad().defined());
  Transformer ref(m, solo, false, 9);
  ref.forward(micro[0].tokens, micro[0].targets).sum().backward();
  const at::Tensor& g = ref.params().find("layers.0.attn.q.weight").tensor.grad();
  EXPECT_LE((q.tensor.grad() - g).abs().max().item<double>(), 1e-5 * g.abs().max().item<double>());
}

}  // namespace
}  // namespace meshtrain::test
