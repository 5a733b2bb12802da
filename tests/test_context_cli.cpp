// Context parallelism through `meshtrain train`, as a user runs it: composed
// with tp (+SP), dp (DDP, ZeRO, HSDP) and pp, every mesh's losses equal the
// one-process run's within fp32 rounding (relative 1e-5, expect_same_losses:
// the meshes reduce in other orders); a cp checkpoint resumes on cp 1; the
// planner's cp traffic matches the runtime's counters; and bad settings are one
// error before any rank starts. Dropout is 0 (cp computes attention without it).
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

std::string metrics(const Dir& d, const std::string& name) {
  return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
}

// 6 steps of the tiny model (seq 32, global batch 8) on a mesh; returns its metrics file.
std::string train(const Dir& d, const std::string& cfg, const std::string& mesh, const std::string& tag) {
  const auto run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + mesh + metrics(d, tag));
  EXPECT_EQ(run.code, 0) << mesh << "\n" << run.output;
  return (d.path / tag).string();
}

TEST(ContextCli, MeshesMatchOneProcess) {
  Dir d;
  const std::string cfg = tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";
  const std::string one = train(d, cfg, " --nproc 1", "one");
  const std::pair<const char*, const char*> meshes[] = {
      {" --nproc 8 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true", "cp2_tp2_dp2_ring"},
      {" --nproc 8 --set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_impl=ulysses --set parallel.zero=3",
       "cp2_tp2_dp2_ulysses_zero3"},
      {" --nproc 4 --set parallel.cp=2 --set parallel.pp=2 --set parallel.zero=1", "cp2_pp2_ring_zero1"},
      {" --nproc 4 --set parallel.cp=4 --set parallel.cp_impl=allgather --set model.attention=tiled", "cp4_allgather"},
      {" --nproc 4 --set parallel.cp=2 --set parallel.zero=2 --set train.recompute=selective", "cp2_dp2_zero2_sel"},
      {" --nproc 8 --set parallel.cp=2 --set parallel.zero=3 --set parallel.dp_shard=2", "cp2_dp4_hsdp"},
  };
  for (const auto& [mesh, tag] : meshes) {
    SCOPED_TRACE(tag);
    expect_same_losses(one, train(d, cfg, mesh, tag), 0, 6);
  }
}

// A checkpoint written by cp 2 x dp 2 resumes on cp 1 (and on cp 4 with
// Ulysses): the losses that follow equal the uninterrupted cp 2 run's.
TEST(ContextCli, CheckpointResumesOnAnotherCp) {
  Dir d;
  const std::string cfg = tiny_config(d, "r.toml", "") + " --set model.dropout=0.0";
  const std::string cp2 = " --nproc 4 --set parallel.cp=2";
  const std::string ref = train(d, cfg, cp2, "ref");
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"'";
  auto run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + cp2 + ck + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string step3 = " --set checkpoint.resume='\"" + (d.path / "ck/step_00000003").string() + "\"'";
  for (const auto& [mesh, tag] : {std::pair<std::string, std::string>{" --nproc 2", "cp1_dp2"},
                                  {" --nproc 4 --set parallel.cp=4 --set parallel.cp_impl=ulysses", "cp4"}}) {
    run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + mesh + step3 + metrics(d, tag));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("saved on tp=1 cp=2 dp=2"), std::string::npos) << run.output;
    expect_same_losses(ref, (d.path / tag).string(), 3, 3);
  }
}

// --check-plan holds the planner's cp bytes (plan/traffic.cpp) against the
// runtime's counters for each implementation, with and without recomputation.
TEST(ContextCli, CheckPlanCountsContextTraffic) {
  Dir d;
  const std::string cfg = tiny_config(d, "p.toml", "") + " --set model.dropout=0.0 --check-plan --set train.stop_after=1";
  for (const std::string mesh :
       {" --nproc 2 --set parallel.cp=2", " --nproc 4 --set parallel.cp=4 --set parallel.cp_impl=ulysses",
        " --nproc 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.cp_impl=allgather",
        " --nproc 2 --set parallel.cp=2 --set train.recompute=selective"}) {
    const auto run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + mesh);
    ASSERT_EQ(run.code, 0) << mesh << "\n" << run.output;
    EXPECT_NE(run.output.find("cp bytes moved"), std::string::npos) << run.output;
  }
}

// Settings the cp group cannot split: one message from the launching process,
// before any rank starts (no "[rank N]" prefix, printed once).
TEST(ContextCli, BadSettingsAreOneErrorBeforeRanksStart) {
  Dir d;
  const std::string cfg = tiny_config(d, "b.toml", "") + " --set model.dropout=0.0";
  const std::pair<std::string, std::string> cases[] = {
      {" --set parallel.cp=3", "is not divisible by 2 x cp = 6"},
      {" --set parallel.cp=4 --set train.seq=36", "is not divisible by 2 x cp = 8"},
      {" --set parallel.cp=2 --set parallel.tp=4 --set parallel.sp=true --set train.seq=20",
       "is not divisible by cp 2 x tp 4"},
      {" --set parallel.cp=8 --set parallel.cp_impl=ulysses", "cp_impl = ulysses gives each cp rank"},
      {" --set parallel.cp=2 --set parallel.cp_impl=striped", "unknown context-parallel attention (cp_impl) 'striped'"},
      {" --set parallel.cp=2 --set model.dropout=0.1", "computes attention without dropout"},
      {" --set parallel.cp=0", "cp = 0 must be at least 1"},
      {" --set parallel.cp=2 --set train.seq=2048", "the shards hold 2 windows of 2049 tokens"},
  };
  for (const auto& [set, message] : cases) {
    const auto run = run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --nproc 8" + set);
    EXPECT_NE(run.code, 0) << set;
    const size_t at = run.output.find(message);
    EXPECT_NE(at, std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find(message, at + 1), std::string::npos) << "printed more than once: " << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a rank started: " << run.output;
  }
}

}  // namespace
}  // namespace meshtrain::test
