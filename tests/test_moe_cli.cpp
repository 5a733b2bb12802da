// A MoE model trained through the binary: the step log and the metrics file
// carry the router's numbers, and a checkpoint written under one expert-
// parallel size resumes under another (ep4 -> ep2 with ZeRO-1 -> ep1 on 4
// ranks, and ep2 under DDP -> ep4) with the losses and gradient norms of the
// uninterrupted run: experts are saved under global names, ZeRO's expert
// slices as boxes of them.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

std::string moe_config(const Dir& d) {
  return tiny_config(d, "moe.toml", "") +
         " --set model.preset='\"moe-tiny\"' --set model.layers=2 --set model.hidden=32 --set model.heads=4"
         " --set model.kv_heads=2 --set model.ffn=64 --set model.experts=8 --set model.top_k=2"
         " --set model.expert_ffn=16 --set model.shared_experts=1 --set model.dropout=0.0";
}

TEST(MoeCli, ExpertParallelCheckpointsResumeOnAnotherEp) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = moe_config(d) + " --nproc 4";
  auto path = [&](const std::string& name) { return (d.path / name).string(); };
  auto set = [&](const std::string& key, const std::string& file) { return " --set " + key + "='\"" + path(file) + "\"'"; };
  auto run = run_command(bin + " train " + cfg + " --set parallel.ep=4" + set("train.metrics", "ref.jsonl"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("moe_imbalance"), std::string::npos) << run.output;
  {
    std::ifstream f(path("ref.jsonl"));
    std::string line;
    std::getline(f, line);
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("moe_tokens_per_expert")) << line;
    double kept = 0;
    for (double t : j["moe_tokens_per_expert"][0]) kept += t;
    EXPECT_EQ(kept, 8 * 32 * 2);  // dropless: the global batch's tokens x top_k, layer 0
    for (const char* k : {"moe_aux", "moe_z", "moe_imbalance", "moe_dropped"}) EXPECT_TRUE(j.contains(k)) << k;
  }
  const std::string ckpt = set("checkpoint.dir", "ckpt");
  run = run_command(bin + " train " + cfg + " --set parallel.ep=4" + ckpt + " --set train.stop_after=2");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + cfg + " --set parallel.ep=2 --set parallel.zero=1" + ckpt + " --set train.stop_after=4" +
                    set("train.metrics", "ep2.jsonl"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("(step 2, saved on tp=1 cp=1 dp=4 pp=1 ep=4"), std::string::npos) << run.output;
  expect_same_losses(path("ref.jsonl"), path("ep2.jsonl"), 2, 2);
  run = run_command(bin + " train " + cfg + " --set parallel.ep=1" + ckpt + set("train.metrics", "ep1.jsonl"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("(step 4, saved on tp=1 cp=1 dp=4 pp=1 ep=2"), std::string::npos) << run.output;
  expect_same_losses(path("ref.jsonl"), path("ep1.jsonl"), 4, 2);
  // DDP with ep 2 on 4 ranks: each expert has two replicas (dp 2), which share its writing, as the dense
  // parameters' four replicas share theirs (train/state.h); the checkpoint resumes under ep 4.
  const std::string ckpt2 = set("checkpoint.dir", "ckpt2");
  run = run_command(bin + " train " + cfg + " --set parallel.ep=2" + ckpt2 + " --set train.stop_after=2");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + cfg + " --set parallel.ep=4" + ckpt2 + set("train.metrics", "ep4.jsonl"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("(step 2, saved on tp=1 cp=1 dp=4 pp=1 ep=2"), std::string::npos) << run.output;
  expect_same_losses(path("ref.jsonl"), path("ep4.jsonl"), 2, 4);
}

// The replica check under expert parallelism compares each parameter over its own replicas:
// experts over dp x cp (the ep ranks hold other experts by design), dense ones over every data
// rank. A healthy ep2 x dp2 run passes every check; a weight changed on rank 2 is still named.
TEST(MoeCli, ReplicaCheckUnderExpertParallelismComparesEachGroup) {
  Dir d;
  const std::string cfg = moe_config(d) + " --nproc 4 --set parallel.ep=2 --set check.replicas_every=1 --set train.steps=4";
  auto run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_EQ(run.output.find("replicas' parameters differ"), std::string::npos) << run.output;
  run = run_command("MESHTRAIN_FAULT='perturb step=2 rank=2' " + std::string(MESHTRAIN_BIN) + " train " + cfg);
  ASSERT_NE(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("after step 2 the data-parallel replicas' parameters differ"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("embed.weight differs on rank 2"), std::string::npos) << run.output;
}

// --check-plan on MoE runs: the planner's parameters and bytes per axis
// (plan/traffic.h: experts whole on every tp rank, split over ep; expert
// gradients over dp x cp; the dispatch and combine moving the rows the layers
// routed to other ep ranks) agree with the runtime within 5%.
TEST(MoeCli, CheckPlanAgreesOnMoeRuns) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = moe_config(d) + " --check-plan --set train.stop_after=1";
  for (const std::string mesh : {" --set parallel.ep=2", " --set parallel.ep=2 --set parallel.zero=1",
                                 " --nproc 4 --set parallel.ep=2 --set train.recompute=\"full\"",
                                 " --set parallel.tp=2 --set parallel.sp=true",
                                 " --nproc 4 --set parallel.ep=2 --set parallel.pp=2"}) {
    const auto run = run_command(bin + " train " + cfg + mesh);
    ASSERT_EQ(run.code, 0) << mesh << "\n" << run.output;
    EXPECT_NE(run.output.find("check-plan, pipeline stage 0"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("ep bytes moved"), std::string::npos) << run.output;
  }
}

// Cross-memory attach (comm_shm.cpp) opens a rank to its user's other processes (PR_SET_PTRACER_ANY)
// so that Yama lets the peers read it. Only a run that uses it may: an ep 2 run's all-to-alls do, the same
// run with MESHTRAIN_SHM_CMA=0 and a dp 2 run (no all-to-all) do not. Observed with strace on the real
// ranks (the launcher's children), since no interface reads the setting back.
TEST(MoeCli, PtracerOnlyWhenCrossMemoryAttachIsUsed) {
  if (run_command("strace -V").code != 0) GTEST_SKIP() << "strace is not installed (scripts/setup.sh installs it)";
  Dir d;
  const std::string trace = (d.path / "prctl.txt").string();
  auto ptracer_calls = [&](const std::string& env, const std::string& sets) {
    const auto run = run_command(env + " strace -f -qq -e trace=prctl -o " + trace + " " + MESHTRAIN_BIN + " train " +
                                 moe_config(d) + " --nproc 2 --set train.steps=2 " + sets);
    EXPECT_EQ(run.code, 0) << run.output;
    std::ifstream f(trace);
    int calls = 0;
    for (std::string line; std::getline(f, line);) calls += line.find("PR_SET_PTRACER") != std::string::npos;
    return calls;
  };
  EXPECT_EQ(ptracer_calls("MESHTRAIN_SHM_CMA=1", "--set parallel.ep=2"), 2);  // each rank, once
  EXPECT_EQ(ptracer_calls("MESHTRAIN_SHM_CMA=0", "--set parallel.ep=2"), 0);
  EXPECT_EQ(ptracer_calls("MESHTRAIN_SHM_CMA=1", "--set parallel.ep=1"), 0);
}

}  // namespace
}  // namespace meshtrain::test
