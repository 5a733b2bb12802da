// The full 3D mesh: dp 2 x tp 2 (sequence parallel) x pp 2 on 8 ranks (the
// mesh_np8 entry runs Mesh*) trains 3 steps equal to one process with the
// same global batch, with the tolerances of tests/train_parity.h: losses and
// gradient norms within 1e-5 relative, weights within 1e-3 of the distance
// the reference travelled.
#include "meshtrain/parallel/pipeline/executor.h"
#include "meshtrain/train/pipeline_step.h"
#include "tests/train_parity.h"

namespace meshtrain::test {
namespace {

void check_3d(plan::Schedule kind, int v, bool tied, bool zero1, int tp_size = 2) {
  Runtime& rt = runtime();
  SCOPED_TRACE(::testing::Message() << plan::to_string(kind) << " v " << v << (tied ? " tied" : " untied")
                                    << (zero1 ? " zero-1" : " flat dp"));
  const MeshLayout layout = MeshLayout::create(rt.world_size(), {{"tp", tp_size}, {"pp", 2}});
  DeviceMesh mesh(rt, layout);
  Comm& tp = mesh.axis("tp");
  Comm& pp = mesh.axis("pp");
  Comm& dp = mesh.group({"dp", "cp"});
  plan::ModelSpec spec = model_spec();
  spec.layers = 4;
  spec.tied = tied;
  Comm solo("solo", rt.rank());
  Transformer single(spec, solo, false, 5);
  auto owned = build_stages(spec, tp, tp_size > 1, 5, pp.rank(), pp.size(), v);
  std::vector<Transformer*> chunks;
  for (auto& c : owned) chunks.push_back(c.get());
  std::unique_ptr<Comm> embed = make_embedding_group(rt, layout);
  const int64_t micro = 2, per_rank = kGlobal / dp.size(), m = per_rank / micro;
  PipelineExecutor exec(plan::build_schedule(kind, pp.size(), static_cast<int>(m), v), chunks, pp,
                        {spec.seq / tp.size(), micro, spec.hidden}, embed.get());
  AdamWOptions o;
  o.lr = 1e-2;
  o.warmup_steps = 1;
  o.total_steps = 3;
  std::vector<std::unique_ptr<ShardedDataParallel>> zero;
  std::vector<ShardedDataParallel*> zero_raw;
  std::vector<Param> updated;
  if (zero1) {
    for (Transformer* c : chunks) {
      zero.push_back(std::make_unique<ShardedDataParallel>(*c, dp, solo, tp, o, ZeroOptions{1}));
      zero_raw.push_back(zero.back().get());
      for (const auto& p : zero.back()->shard_params()) updated.push_back(p);
    }
  } else {
    updated = pipeline_params(chunks);
  }
  AdamW opt(updated, o), opt1(single.params().params(), o);
  PipelineTrainStep step(chunks, exec, opt, dp, tp, pp, zero_raw);
  TrainStep step1(single, opt1, solo, solo);
  std::map<std::string, at::Tensor> init;
  for (const auto& p : single.params().params()) init[p.name] = p.tensor.detach().clone();
  for (int s = 0; s < 3; ++s) {
    const Batch g = global_batch(spec, s);
    const StepResult r = step.run(split(g, dp.rank() * per_rank, per_rank, micro));
    const StepResult r1 = step1.run(split(g, 0, kGlobal, 4));
    EXPECT_EQ(r.tokens, r1.tokens);
    EXPECT_NEAR(r.loss, r1.loss, 1e-5 * r1.loss) << "step " << s;
    EXPECT_NEAR(r.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << s;
  }
  std::map<std::string, at::Tensor> ref;
  for (const auto& p : single.params().params()) ref[p.name] = p.tensor.detach();
  for (Transformer* c : chunks) {
    for (const auto& p : c->params().params()) {
      at::Tensor w = p.tp_dim >= 0 ? gather_along(p.tensor.detach(), tp, p.tp_dim) : p.tensor.detach();
      at::Tensor w1 = ref.at(p.name), w0 = init.at(p.name);
      if (p.name == "embed.weight" || p.name == "head.weight") {
        w = w.narrow(0, 0, spec.vocab);
        w1 = w1.narrow(0, 0, spec.vocab);
        w0 = w0.narrow(0, 0, spec.vocab);
      }
      const double travelled = (w1 - w0).norm().item<double>(), apart = (w - w1).norm().item<double>();
      EXPECT_LE(apart, 1e-3 * travelled) << p.name;
    }
  }
}

TEST(MeshPipeline, ThreeDMeshMatchesOneProcess) {
  if (runtime().world_size() != 8) GTEST_SKIP() << "dp 2 x tp 2 x pp 2 needs 8 ranks";
  check_3d(plan::Schedule::OneFOneB, 1, false, false);
  check_3d(plan::Schedule::Interleaved, 2, true, false);
  check_3d(plan::Schedule::OneFOneB, 1, true, true);
}

// pp 2 on 2 ranks (tied: the last stage's embedding copy is updated like the
// first's) and pp 2 x tp 2 on 4.
TEST(PipelineTrain, PipelineAndTensorParallelMatchOneProcess) {
  const int n = runtime().world_size();
  if (n == 2) check_3d(plan::Schedule::OneFOneB, 1, true, false, 1);
  if (n == 4) check_3d(plan::Schedule::OneFOneB, 1, false, false, 2);
  if (n != 2 && n != 4) GTEST_SKIP() << "2 or 4 ranks";
}

// Stages run one after the other in one process equal the whole model, with
// tp 2 and sequence parallelism (the last stage has no embedding, yet must
// know its vocabulary slice for the cross-entropy).
TEST(PipelineTrain, StagesComposeToTheWholeModelUnderTensorParallelism) {
  if (runtime().world_size() != 2) GTEST_SKIP() << "tp 2";
  Comm& tp = runtime().world();
  plan::ModelSpec spec = model_spec();
  spec.layers = 4;
  Transformer whole(spec, tp, true, 5);
  Transformer s0(spec, tp, true, 5, StagePart{0, 2, true, false}), s1(spec, tp, true, 5, StagePart{2, 4, false, true});
  const Batch g = global_batch(spec, 0);
  const at::Tensor a = whole.forward(g.tokens, g.targets);
  const at::Tensor b = s1.stage_forward(s0.stage_forward(g.tokens, g.targets), g.targets);
  EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6)) << a.sum() << " vs " << b.sum();
}

}  // namespace
}  // namespace meshtrain::test
