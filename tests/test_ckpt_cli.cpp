// Checkpoints through `meshtrain train` as a user runs it: exact resume on the
// same mesh and on another (ZeRO <-> DDP, pipeline), the memory a save and a
// load add, elastic restarts, crashes and hangs in the middle of a save, and
// what a checkpoint serves afterwards (sampling, export, config errors).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <filesystem>
#include <future>
#include <iterator>
#include <map>
#include <fstream>
#include <sstream>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using test::Dir;
using test::error_of;
using test::expect_same_losses;
using test::losses;
using test::tiny_config;

// Training 6 steps equals training 3, stopping, resuming and training 3 more:
// bitwise, with dropout on (its masks are keyed by the step: nothing to restore). Also checks
// every checkpoint verifies.
TEST(TrainCli, ResumeIsExact) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string ref = tiny_config(d, "ref.toml", "");
  auto run = test::run_command(bin + " train " + ref + " --set train.metrics='\"" + (d.path / "ref.metrics").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string ck = (d.path / "ck").string();
  const std::string split = tiny_config(d, "split.toml", "[checkpoint]\ndir = \"" + ck + "\"\nkeep = 5\n");
  const std::string metrics = " --set train.metrics='\"" + (d.path / "split.metrics").string() + "\"'";
  run = test::run_command(bin + " train " + split + metrics + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("checkpoint " + ck + "/step_00000003 saved"), std::string::npos) << run.output;
  run = test::run_command(bin + " train " + split + metrics);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed from " + ck + "/step_00000003 (step 3"), std::string::npos) << run.output;
  const auto a = losses((d.path / "ref.metrics").string()), b = losses((d.path / "split.metrics").string());
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  run = test::run_command(bin + " ckpt verify " + ck);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("step_00000006: "), std::string::npos) << run.output;

  // The same checkpoint on another mesh (tp 2 with sequence parallelism instead
  // of dp 2), dropout off: the losses that follow equal those of the mesh that
  // saved it, within fp32 rounding (relative 1e-5: other reduction orders).
  const std::string step3 = " --set checkpoint.resume='\"" + ck + "/step_00000003\"' --set model.dropout=0.0";
  run = test::run_command(bin + " train " + ref + step3 + " --set train.metrics='\"" + (d.path / "dp.metrics").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(bin + " train " + ref + step3 + " --set parallel.tp=2 --set parallel.sp=true --set train.metrics='\"" +
                          (d.path / "tp.metrics").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("saved on tp=1 cp=1 dp=2"), std::string::npos) << run.output;
  const auto dp = losses((d.path / "dp.metrics").string()), tp = losses((d.path / "tp.metrics").string());
  ASSERT_EQ(dp.size(), 3u);
  ASSERT_EQ(tp.size(), 3u);
  for (const auto& [step, v] : dp) {
    const double x = std::stod(v), y = std::stod(tp.at(step));
    EXPECT_NEAR(x, y, 1e-5 * x) << "step " << step;
  }
}

// FP8 with delayed scaling: each linear's amax history is training state. Stopping at
// step 3 and resuming gives bitwise the uninterrupted run's steps 4 to 6, the history
// stored once per linear ([3, fp8_history]: input, weight, gradient, newest step first).
// Resumed without it (a fresh history scales step 4 by its own tensors) the run differs.
TEST(TrainCli, Fp8DelayedScalingStateResumesBitwise) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string fp8 = " --set train.precision='\"fp8\"' --set train.fp8_scaling='\"delayed\"'";
  const auto metrics = [&](const std::string& name) {
    return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
  };
  const std::string cfg = tiny_config(d, "fp8.toml", "");
  auto run = test::run_command(bin + " train " + cfg + fp8 + metrics("ref.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string ck = (d.path / "ck").string();
  const std::string save = " --set checkpoint.dir='\"" + ck + "\"' --set checkpoint.keep=5";
  run = test::run_command(bin + " train " + cfg + fp8 + save + metrics("split.metrics") + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(bin + " train " + cfg + fp8 + save + metrics("split.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed from " + ck + "/step_00000003 (step 3"), std::string::npos) << run.output;
  const auto ref = losses((d.path / "ref.metrics").string());
  ASSERT_EQ(ref.size(), 6u);
  EXPECT_EQ(ref, losses((d.path / "split.metrics").string()));

  ckpt::Reader r(ck + "/step_00000003");
  int histories = 0;
  for (const auto& [name, entry] : r.manifest().at("tensors").items()) {
    if (name.rfind("fp8/", 0) != 0) continue;
    ++histories;
    const at::Tensor h = r.read_full(name);
    EXPECT_EQ(h.sizes(), (std::vector<int64_t>{3, 16})) << name;
    // Three steps pushed, newest first; the older entries still zero.
    EXPECT_GT(h.narrow(1, 0, 3).min().item<float>(), 0.0f) << name;
    EXPECT_EQ(h.narrow(1, 3, 13).abs().max().item<float>(), 0.0f) << name;
  }
  EXPECT_EQ(histories, 2 * 6);  // gpt-tiny, 2 layers: q, k, v, o, fc1, fc2 each
  ASSERT_TRUE(r.has("fp8/layers.1.mlp.fc2.amax_history"));

  // Without the histories (the same checkpoint, its fp8 tensors left out): another step 4.
  const std::string bare = (d.path / "bare").string();
  fs::create_directories(bare);
  for (const auto& e : fs::directory_iterator(ck + "/step_00000003")) fs::copy(e.path(), bare + "/" + e.path().filename().string());
  {
    nlohmann::json m = r.manifest();
    for (auto it = m["tensors"].begin(); it != m["tensors"].end();) {
      it = it.key().rfind("fp8/", 0) == 0 ? m["tensors"].erase(it) : std::next(it);
    }
    std::ofstream(bare + "/manifest.json") << m.dump();
  }
  run = test::run_command(bin + " train " + cfg + fp8 + metrics("bare.metrics") + " --set checkpoint.resume='\"" + bare +
                          "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto fresh = losses((d.path / "bare.metrics").string());
  ASSERT_TRUE(fresh.count(4)) << run.output;
  EXPECT_NE(fresh.at(4), ref.at(4));
}

// A checkpoint saved under ZeRO-3 on 4 ranks resumes under DDP on 2 ranks, and
// one saved under DDP on 2 ranks resumes under ZeRO-3 on 4: the losses that
// follow equal those of the uninterrupted run (checkpoints hold whole
// parameters and moments, whatever sharding wrote them).
TEST(TrainCli, ZeroCheckpointsResumeUnderDdpAndBack) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "z.toml", "") + " --set model.dropout=0.0";
  const std::string zero3 = " --nproc 4 --set parallel.zero=3", ddp = " --nproc 2";
  auto metrics = [&](const std::string& name) {
    return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
  };
  auto ckpt = [&](const std::string& name) {
    return " --set checkpoint.dir='\"" + (d.path / name).string() + "\"'";
  };
  for (const auto& [first, second, tag] : {std::tuple{zero3, ddp, "zero3_to_ddp"}, {ddp, zero3, "ddp_to_zero3"}}) {
    auto run = test::run_command(bin + " train " + cfg + first + metrics(std::string(tag) + ".ref"));
    ASSERT_EQ(run.code, 0) << run.output;
    run = test::run_command(bin + " train " + cfg + first + ckpt(tag) + " --set train.stop_after=3");
    ASSERT_EQ(run.code, 0) << run.output;
    if (first == ddp) {  // the replicas share the writing (train/state.h): neither file holds most of the state
      const std::filesystem::path step = d.path / tag / "step_00000003";
      const double a = static_cast<double>(std::filesystem::file_size(step / "rank_00000.safetensors"));
      const double b = static_cast<double>(std::filesystem::file_size(step / "rank_00001.safetensors"));
      EXPECT_GT(std::min(a, b) / (a + b), 0.3) << a << " and " << b << " bytes";
    }
    run = test::run_command(bin + " train " + cfg + second + ckpt(tag) + metrics(std::string(tag) + ".resumed"));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("(step 3, saved on tp=1 cp=1 dp=" + std::string(first == zero3 ? "4" : "2")),
              std::string::npos)
        << run.output;
    if (second == zero3) {
      EXPECT_NE(run.output.find("ZeRO-3"), std::string::npos) << run.output;
    }
    expect_same_losses((d.path / (std::string(tag) + ".ref")).string(),
                       (d.path / (std::string(tag) + ".resumed")).string(), 3, 3);
  }
}

// "peak extra memory 1.23 MiB per rank" in a run's log, in bytes (every match, in order).
std::vector<double> peak_extra(const std::string& log) {
  std::vector<double> out;
  const std::string key = "peak extra memory ";
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    std::istringstream in(log.substr(at + key.size(), 20));
    double v = 0;
    std::string unit;
    in >> v >> unit;
    const std::map<std::string, double> scale{{"B", 1}, {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
    out.push_back(v * scale.at(unit));
  }
  return out;
}

// ZeRO-3 on 4 ranks saves a model whose whole state (weights and both
// moments, 12 bytes a parameter: 45 MiB here) is 4x each rank's, without
// gathering it: the save adds at most the 1 MiB staging buffer and 3 MiB of
// bookkeeping to any rank (measured by the kernel's high-water mark); the
// checkpoint resumes on 2 ranks under ZeRO-3 and under DDP within the same
// bound, and the losses that follow equal the uninterrupted run's.
TEST(TrainCli, Zero3CheckpointsStayWithinTheStagingBuffer) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "z.toml", "") +
                          " --set model.dropout=0.0 --set model.hidden=384 --set model.ffn=1536 --set train.steps=5 "
                          "--set checkpoint.every=3 --set checkpoint.staging_mb=1 --set checkpoint.dir='\"" +
                          (d.path / "ck").string() + "\"'";
  const double bound = (1 << 20) + 3.0 * (1 << 20);
  auto metrics = [&](const std::string& name) {
    return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
  };
  auto run = test::run_command(bin + " train " + cfg + " --nproc 4 --set parallel.zero=3" + metrics("ref"));
  ASSERT_EQ(run.code, 0) << run.output;
  auto saves = peak_extra(run.output);
  ASSERT_EQ(saves.size(), 2u) << run.output;  // steps 3 and 5
  for (double b : saves) EXPECT_LT(b, bound) << run.output;
  const std::string from3 = " --set checkpoint.resume='\"" + (d.path / "ck/step_00000003").string() + "\"'";
  for (const std::string second : {" --nproc 2 --set parallel.zero=3", " --nproc 2"}) {
    const std::string tag = second.find("zero") != std::string::npos ? "zero3" : "ddp";
    const std::string out = (d.path / ("ck_" + tag)).string();
    run = test::run_command(bin + " train " + cfg + second + from3 + metrics(tag) + " --set checkpoint.dir='\"" + out +
                            "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    const auto loads = peak_extra(run.output);
    ASSERT_GE(loads.size(), 1u) << run.output;
    EXPECT_NE(run.output.find("resumed from"), std::string::npos) << run.output;
    EXPECT_LT(loads[0], bound) << run.output;
    test::expect_same_losses((d.path / "ref").string(), (d.path / tag).string(), 3, 2);
  }
}

// The pid of the rank `rank` process whose command line mentions `marker`, or -1.
pid_t rank_pid(const std::string& marker, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto slurp = [&](const char* file) {
      std::ifstream f(e.path() / file, std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    };
    const std::string env = '\0' + slurp("environ");
    if (slurp("cmdline").find(marker) != std::string::npos &&
        env.find(std::string(1, '\0') + "RANK=" + std::to_string(rank) + '\0') != std::string::npos) {
      return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

// Elastic restart: rank 1 is SIGKILLed mid-run (async checkpoints every 5
// steps, one possibly being written); `train --max-restarts 1` restarts both
// ranks from the newest checkpoint that verifies, logging why, and the run
// finishes with exactly the losses and gradient norms of an uninterrupted run
// (same mesh: the resume is exact, dropout masks included). Without restarts
// left, the failure is the run's exit status.
TEST(TrainCli, ElasticRestartAfterAKillMatchesAnUninterruptedRunBitwise) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "e.toml", "") + " --set train.steps=40 --set checkpoint.every=5 "
                          "--set checkpoint.async=true --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"'";
  auto metrics = [&](const std::string& name) {
    return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
  };
  auto run = test::run_command(bin + " train " + tiny_config(d, "e.toml", "") +
                               " --set train.steps=40" + metrics("ref"));
  ASSERT_EQ(run.code, 0) << run.output;
  // Runs `args`, SIGKILLs rank 1 once its metrics reach `step`; whether it could.
  auto run_and_kill = [&](const std::string& args, const std::string& log, int step, bool& killed) {
    auto job = std::async(std::launch::async, [&] { return test::run_command(bin + " train " + cfg + args + metrics(log)); });
    killed = false;
    for (int i = 0; i < 6000 && !killed; ++i) {
      if (job.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) break;
      const auto seen = test::losses((d.path / log).string());
      if (seen.empty() || seen.rbegin()->first < step) continue;
      const pid_t victim = rank_pid((d.path / "ck").string(), 1);
      killed = victim > 0 && ::kill(victim, SIGKILL) == 0;
    }
    return job.get();
  };
  bool killed = false;
  run = run_and_kill(" --max-restarts 1", "elastic", 12, killed);
  ASSERT_TRUE(killed) << "the run ended before rank 1 could be killed\n" << run.output;
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 failed with signal 9"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("restarting all local ranks (1 of 1 restarts)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("restart 1: resuming from " + (d.path / "ck/step_000000").string()), std::string::npos)
      << run.output;
  const auto ref = test::losses((d.path / "ref").string()), got = test::losses((d.path / "elastic").string());
  ASSERT_EQ(got.size(), 40u);
  for (const auto& [step, v] : ref) EXPECT_EQ(got.at(step), v) << "step " << step;  // bitwise: the printed doubles
  // No restarts left: the kill is the run's failure.
  run = run_and_kill(" --set train.steps=400", "once", 45, killed);
  ASSERT_TRUE(killed) << run.output;
  EXPECT_EQ(run.code, 128 + SIGKILL) << run.output;
  EXPECT_NE(run.output.find("rank 1 failed with signal 9"), std::string::npos) << run.output;
}

// Crash consistency: the run is killed (SIGKILL, by MESHTRAIN_CRASH_AT) at each
// point of a save where a crash leaves something behind: the ranks' files
// written by the async writers, the manifest written before the rename, the
// old copy of a step saved again renamed away, a retired checkpoint renamed
// before its deletion. Each time the next run resumes from the newest complete
// checkpoint (the old copy is restored: it was the only one), nothing else
// stays in the directory, and the losses equal the uninterrupted run's bitwise.
TEST(TrainCli, KilledMidSaveResumesFromTheNewestCompleteCheckpoint) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string ck = (d.path / "ck").string();
  const std::string cfg = tiny_config(d, "c.toml", "[checkpoint]\nevery = 2\nkeep = 1\ndir = \"" + ck + "\"\n");
  const std::string metrics = " --set train.metrics='\"" + (d.path / "m").string() + "\"'";
  auto run = test::run_command(bin + " train " + tiny_config(d, "ref.toml", "") + " --set train.metrics='\"" +
                               (d.path / "ref").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const auto ref = test::losses((d.path / "ref").string());
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  struct Case {
    std::string crash, args, resumed_step;
  };
  const std::vector<Case> cases = {
      {"ckpt.rank_file_written@2", " --set checkpoint.async=true", "2"},
      {"ckpt.manifest_written@2", "", "2"},
      {"ckpt.retire_renamed", "", "4"},
      // Step 4 saved again after resuming from step 2 (keep 2: both stay); killed between the renames.
      {"ckpt.old_renamed", " --set checkpoint.keep=2 --set checkpoint.resume='\"" + ck + "/step_00000002\"'", "4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.crash);
    fs::remove_all(ck);
    fs::remove(d.path / "m");
    if (c.crash == "ckpt.old_renamed") {  // first: steps 2 and 4 saved
      run = test::run_command(bin + " train " + cfg + metrics + " --set checkpoint.keep=2 --set train.stop_after=4");
      ASSERT_EQ(run.code, 0) << run.output;
    }
    run = test::run_command("MESHTRAIN_CRASH_AT=" + c.crash + " " + bin + " train " + cfg + metrics + c.args);
    ASSERT_EQ(run.code, 128 + SIGKILL) << run.output;
    EXPECT_NE(run.output.find("crash point " + c.crash.substr(0, c.crash.find('@')) + " reached"), std::string::npos)
        << run.output;
    run = test::run_command(bin + " train " + cfg + metrics + (c.crash == "ckpt.old_renamed" ? " --set checkpoint.keep=2" : ""));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("resumed from " + ck + "/step_0000000" + c.resumed_step + " (step " + c.resumed_step),
              std::string::npos)
        << run.output;
    const std::vector<std::string> kept =
        c.crash == "ckpt.old_renamed" ? std::vector<std::string>{".lock", "step_00000004", "step_00000006"}
                                      : std::vector<std::string>{".lock", "step_00000006"};
    EXPECT_EQ(listing(), kept);
    const auto got = test::losses((d.path / "m").string());
    ASSERT_EQ(got.size(), 6u);
    for (const auto& [step, v] : ref) EXPECT_EQ(got.at(step), v) << "step " << step;
  }
}

// A rank that hangs while writing its part of a checkpoint (SIGSTOP, as a
// stalled disk or a paused machine would) ends the run after the checkpoint's
// own timeout (checkpoint.timeout = 3 s), not the training collectives' 300 s,
// with an error naming the checkpoint group; the step saved before stays, and
// the next run resumes from it.
TEST(TrainCli, AHangDuringASaveEndsAfterTheCheckpointTimeout) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string ck = (d.path / "ck").string();
  const std::string cfg = tiny_config(d, "h.toml", "[checkpoint]\nevery = 2\nkeep = 2\ntimeout = 3\ndir = \"" + ck + "\"\n");
  const auto t0 = std::chrono::steady_clock::now();
  auto run = test::run_command("MESHTRAIN_CRASH_AT='ckpt.rank_file_written@2 rank=1 signal=STOP' " + bin + " train " +
                               cfg);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("crash point ckpt.rank_file_written reached (MESHTRAIN_CRASH_AT): stopping"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("rank 0 failed with exit code 1 (its error: all_gather on group 'checkpoint' (global ranks "
                            "[0, 1], this is group rank 0 of 2; timeout 3 s)"),
            std::string::npos)
      << run.output;
  EXPECT_LT(seconds, 60) << run.output;
  // The launcher names the rank that never arrived (from the flight records), not only the one that timed out.
  EXPECT_NE(run.output.find("meshtrain launch: rank 1 (process stopped (SIGSTOP or a debugger); no flight record) "
                            "never arrived at all_gather at sequence "),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("on group 'checkpoint' (rank 0 failed there); rank 0 failed with exit code 1"),
            std::string::npos)
      << run.output;
  // The launcher keeps the flight records for `meshtrain diagnose hang`; this test has read its report.
  if (const size_t at = run.output.find("flight records in "); at != std::string::npos) {
    fs::remove_all(run.output.substr(at + 18, run.output.find(';', at) - at - 18));
  }
  run = test::run_command(bin + " train " + cfg);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed from " + ck + "/step_00000002 (step 2"), std::string::npos) << run.output;
}

// Per-stage checkpoints: a run on pp 2 saves each stage's layers under their
// global names; the checkpoint resumes on dp 2 (no pipeline) and on pp 2 with
// the interleaved schedule (other stage boundaries), and the losses that
// follow equal the uninterrupted pp 2 run's.
TEST(TrainCli, PipelineCheckpointsResumeOnAnotherMesh) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "p.toml", "") + " --set model.dropout=0.0 --set model.layers=4";
  const std::string pp = " --nproc 2 --set parallel.pp=2";
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"'";
  auto metrics = [&](const std::string& name) {
    return " --set train.metrics='\"" + (d.path / name).string() + "\"'";
  };
  auto run = test::run_command(bin + " train " + cfg + pp + metrics("ref"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("predicted"), std::string::npos) << run.output;  // the bubble, measured and predicted
  run = test::run_command(bin + " train " + cfg + pp + ck + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(bin + " ckpt verify " + (d.path / "ck").string());
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string step3 = " --set checkpoint.resume='\"" + (d.path / "ck/step_00000003").string() + "\"'";
  for (const auto& [mesh, tag] : {std::pair<std::string, std::string>{" --nproc 2", "dp2"},
                                  {pp + " --set parallel.virtual=2 --set parallel.schedule=interleaved", "v2"}}) {
    run = test::run_command(bin + " train " + cfg + mesh + step3 + metrics(tag));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("saved on tp=1 cp=1 dp=1 pp=2"), std::string::npos) << run.output;
    expect_same_losses((d.path / "ref").string(), (d.path / tag).string(), 3, 3);
  }
  // Micro-batches the schedule cannot take: one error naming the settings.
  run = test::run_command(bin + " train " + cfg + pp +
                          " --set parallel.virtual=2 --set parallel.schedule=interleaved --set train.global_batch=2");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("parallel.schedule = interleaved with pp 2, virtual 2 and 1 micro-batches per step"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("needs micro-batches (1) divisible by pp (2)"), std::string::npos) << run.output;
}

// The user's path end to end: tokenize a corpus, train on 2 ranks (tp 2) with
// a checkpoint, sample from it in one process, export the weights.
TEST(TrainCli, SampleAndExportFromACheckpoint) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  {
    std::ofstream f(d.path / "corpus.txt");
    const char* words[] = {"the", "light", "was", "good", "and", "darkness", "upon", "face", "of", "deep", "waters"};
    for (int line = 0; line < 400; ++line) {
      for (int w = 0; w < 8; ++w) f << words[(line * 7 + w * 3) % 11] << (w < 7 ? " " : "\n");
    }
  }
  auto run = test::run_command(bin + " tokenize --input " + (d.path / "corpus.txt").string() + " --out " +
                               (d.path / "tok").string() + " --vocab-size 400");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string ck = (d.path / "ck").string();
  const std::string cfg = d.write("s.toml", "[model]\npreset = \"llama-tiny\"\nlayers = 2\nvocab = 400\n[data]\ntrain = \"" +
                                                (d.path / "tok/train.bin").string() +
                                                "\"\n[train]\nsteps = 3\nmicro_batch = 2\nglobal_batch = 2\nseq = 32\n"
                                                "[checkpoint]\ndir = \"" + ck + "\"\nasync = true\n"
                                                "[parallel]\ntp = 2\nnproc = 2\n");
  run = test::run_command(bin + " train " + cfg);
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(bin + " sample " + ck + " --prompt 'the light' --tokens 12 --samples 2 --top-k 5 --top-p 0.9");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("--- sample 2"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\nthe light"), std::string::npos) << run.output;  // the prompt, decoded back
  run = test::run_command(bin + " sample " + ck + " --top-p 2");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("top-p in (0, 1] (got 2)"), std::string::npos) << run.output;
  run = test::run_command(bin + " ckpt export " + ck + " --out " + (d.path / "m.safetensors").string());
  ASSERT_EQ(run.code, 0) << run.output;
}

TEST(TrainCli, CheckpointConfigErrors) {
  Dir d;
  const std::string cfg = tiny_config(d, "c.toml", "[checkpoint]\nkeep = 0\n");
  EXPECT_NE(error_of(cfg).find("checkpoint.keep = 0 must be at least 1"), std::string::npos) << error_of(cfg);
  EXPECT_NE(error_of(cfg, {"checkpoint.keep=1", "checkpoint.evry=3"}).find("unknown config key 'checkpoint.evry'"),
            std::string::npos);
  // Resuming from something that is not a checkpoint names it (keep back at its default: this run saves none).
  auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --set checkpoint.keep=2 --nproc 1 " +
                               "--set checkpoint.resume='\"" + d.path.string() + "\"'");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("is neither a checkpoint"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace meshtrain
