// The numerics and hardware layers of loss-spike troubleshooting through the
// binary: `meshtrain diagnose step` (train/diagnose.h) replaying a step of a
// 2-rank run, with and without a NaN injected into one layer
// (platform/fault.h), and the replica check (train/replica_check.h) finding a
// weight changed on one of 4 data-parallel ranks.
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

using test::Dir;

const std::string kBin = MESHTRAIN_BIN;

// The tiny 2-rank run with dropout 0.1 (one process replays its masks: they are
// keyed by the step and the rows' places in the global batch), checkpoints every 2 steps.
std::string config(const Dir& d) {
  return test::tiny_config(d, "c.toml", "[checkpoint]\nevery = 2\nkeep = 3\ndir = \"" + (d.path / "ck").string() + "\"\n") +
         " --set model.dropout=0.1 --set train.metrics='\"" + (d.path / "m").string() + "\"'";
}

// A replay of step 4 from the checkpoint of step 2 (steps 3 and 4 replayed)
// gives the run's loss (up to fp32 summation order: the run summed over 2
// ranks), finds every tensor finite, and two replays agree bitwise. The run
// had the replica check on every step: no mismatch on a healthy run.
TEST(DiagnoseCli, AReplayedStepGivesTheRunsLossAndIsDeterministic) {
  Dir d;
  auto run = test::run_command(kBin + " train " + config(d) + " --set check.replicas_every=1");
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(kBin + " diagnose step " + (d.path / "ck/step_00000002").string() + " --step 4");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("step 3 replayed first"), std::string::npos) << run.output;
  const size_t at = run.output.find("loss ");
  ASSERT_NE(at, std::string::npos) << run.output;
  const double replayed = std::stod(run.output.substr(at + 5));
  const double trained = std::stod(test::losses((d.path / "m").string()).at(4));
  EXPECT_NEAR(replayed, trained, 1e-5 * trained) << run.output;
  for (const char* want : {"first non-finite tensor: none", "exploding: no layer", "replayed twice, bitwise equal",
                           "layers.0 ", "layers.1 ", "data: 8 windows of 32 tokens"}) {
    EXPECT_NE(run.output.find(want), std::string::npos) << want << "\n" << run.output;
  }
  // A step not after the checkpoint's is one error naming the fix.
  run = test::run_command(kBin + " diagnose step " + (d.path / "ck/step_00000004").string() + " --step 4");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("--step 5 or later"), std::string::npos) << run.output;
}

// A NaN injected into layer 1's output at step 5: the run (spike.policy =
// skip) reports the spike and drops the update; the replay of step 5 from the
// checkpoint of step 4 names layer 1's output as the first non-finite tensor.
TEST(DiagnoseCli, AnInjectedNanIsTracedToItsLayer) {
  Dir d;
  const std::string fault = "MESHTRAIN_FAULT='nan layer=1 step=5' ";
  auto run = test::run_command(fault + kBin + " train " + config(d) + " --set spike.policy='\"skip\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("loss spike (loss is nan)"), std::string::npos) << run.output;
  run = test::run_command(fault + kBin + " diagnose step " + (d.path / "ck/step_00000004").string() + " --step 5");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("first non-finite tensor: layers.1 output (forward, micro-batch 0)"), std::string::npos)
      << run.output;
  run = test::run_command("MESHTRAIN_FAULT='nan step=5' " + kBin + " diagnose step " +
                          (d.path / "ck/step_00000004").string() + " --step 5");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("MESHTRAIN_FAULT='nan step=5': it needs layer=L"), std::string::npos) << run.output;
}

// One weight changed on rank 2 of 4 data-parallel ranks after step 3: the
// replica check of step 3 stops the run, naming the parameter and rank 2.
TEST(DiagnoseCli, TheReplicaCheckNamesTheCorruptRank) {
  Dir d;
  const auto run = test::run_command("MESHTRAIN_FAULT='perturb step=3 rank=2' " + kBin + " train " + config(d) +
                                     " --nproc 4 --set check.replicas_every=1");
  ASSERT_NE(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("after step 3 the data-parallel replicas' parameters differ"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("embed.weight differs on rank 2 (1 of 4 replicas)"), std::string::npos) << run.output;
  EXPECT_NE(test::error_of(test::tiny_config(d, "z.toml", ""), {"parallel.zero=3", "check.replicas_every=5"})
                .find("ZeRO-3 keeps none"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
