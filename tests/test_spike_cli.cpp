// The loss-spike defence (train/spike.h) through `meshtrain train`, 2 ranks
// (DDP): a global batch of random tokens injected into data the model learns
// quickly makes a real spike of the loss and the gradient norm at step 14.
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshtrain/data/loader.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/train/spike.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

using test::Dir;
namespace fs = std::filesystem;

constexpr int64_t kSeq = 32, kBatch = 8, kSpikeStep = 14;

// A window the model learns within a few steps: 0, 1, ..., 31 with one marker
// token at position 16 that tells the windows apart (so a batch read in the
// wrong place changes the losses).
std::vector<uint32_t> clean_window(int64_t w) {
  std::vector<uint32_t> t(kSeq);
  for (int64_t i = 0; i < kSeq; ++i) t[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  t[16] = static_cast<uint32_t>(32 + w % 30);
  return t;
}

// Random tokens (after the leading 0 every window starts with).
std::vector<uint32_t> spike_window(std::mt19937& g) {
  std::vector<uint32_t> t(kSeq);
  for (int64_t i = 1; i < kSeq; ++i) t[static_cast<size_t>(i)] = static_cast<uint32_t>(g() % 64);
  return t;
}

// Writes a shard that the loader (seed 1) reads as `windows` in this order, a
// global batch of kBatch at a time: the loader's permutation depends only on
// the number of windows, so it is read off a shard of that many first. Every
// window begins with token 0, so window w's last target (the next window's
// first token) is 0 whatever the order.
void write_in_read_order(const std::string& path, const std::vector<std::vector<uint32_t>>& windows) {
  const size_t n = windows.size();
  write_shard(path, std::vector<uint32_t>(n * kSeq + 1, 0), {0}, 2);
  std::vector<uint64_t> order;
  TokenLoader l({path}, kSeq, kBatch, 0, 1, 1);
  for (size_t s = 0; s < n / kBatch; ++s) {
    for (uint64_t w : l.next().windows) order.push_back(w);
  }
  ASSERT_EQ(order.size(), n);
  std::vector<uint32_t> tokens(n * kSeq + 1, 0);
  for (size_t j = 0; j < n; ++j) {
    std::copy(windows[j].begin(), windows[j].end(), tokens.begin() + static_cast<std::ptrdiff_t>(order[j] * kSeq));
  }
  write_shard(path, tokens, {0}, 2);
}

struct Data {
  std::string clean, spiky;
};

// 24 global batches of clean windows; the spiky data has a batch of random
// windows read at step kSpikeStep, the clean ones after it one step later.
Data write_data(const Dir& d) {
  std::vector<std::vector<uint32_t>> clean;
  for (int64_t w = 0; w < 24 * kBatch; ++w) clean.push_back(clean_window(w));
  std::vector<std::vector<uint32_t>> spiky(clean.begin(), clean.begin() + (kSpikeStep - 1) * kBatch);
  std::mt19937 g(7);
  for (int64_t i = 0; i < kBatch; ++i) spiky.push_back(spike_window(g));
  spiky.insert(spiky.end(), clean.begin() + (kSpikeStep - 1) * kBatch, clean.end() - kBatch);
  Data out{(d.path / "clean.bin").string(), (d.path / "spiky.bin").string()};
  write_in_read_order(out.clean, clean);
  write_in_read_order(out.spiky, spiky);
  return out;
}

std::string config(const Dir& d, const std::string& data, const std::string& extra) {
  return d.write("c.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.1\n"
                           "[data]\ntrain = \"" + data + "\"\n[train]\nsteps = 20\nmicro_batch = 2\nglobal_batch = 8\n"
                           "seq = 32\nlr = 1e-2\nlog_every = 1\n[parallel]\nnproc = 2\n"
                           "[spike]\nwindow = 8\nwarmup = 8\n" + extra);
}

// Runs `meshtrain train` (with `sets`: --set options) and returns its metrics file's lines.
std::vector<nlohmann::json> train(const Dir& d, const std::string& data, const std::string& tag,
                                  const std::string& extra, std::string* output, const std::string& sets = "") {
  const std::string metrics = (d.path / tag).string();
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + config(d, data, extra) +
                                     " --set train.metrics='\"" + metrics + "\"'" + sets);
  EXPECT_EQ(run.code, 0) << run.output;
  if (output) *output = run.output;
  std::vector<nlohmann::json> lines;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The spikes in a run's metrics: {step, action}.
std::vector<std::pair<int64_t, std::string>> spikes(const std::vector<nlohmann::json>& lines) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& j : lines) {
    if (j.contains("spike")) out.emplace_back(j["step"].get<int64_t>(), j["spike"]["action"].get<std::string>());
  }
  return out;
}

// step -> "loss grad_norm" as written (the last line of each step).
std::map<int64_t, std::string> steps(const std::vector<nlohmann::json>& lines) {
  std::map<int64_t, std::string> out;
  for (const auto& j : lines) {
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].dump() + " " + j["grad_norm"].dump();
  }
  return out;
}

// Under rollback the run reloads the checkpoint of step 12, drops the spike's
// batch from the data and trains on: every step's loss and gradient norm
// equal, bitwise, those of a run whose data never held that batch (dropout on:
// the masks are keyed by the step and the row's place in it), with DDP, ZeRO-1 and a
// pipeline of 2 stages. The checkpoint records the event and the dropped
// batch, and the clean run reports no spike.
TEST(SpikeCli, RollbackTrainsAsIfTheSpikeBatchWereNeverInTheData) {
  Dir d;
  const Data data = write_data(d);
  for (const std::string mesh : {"", " --set parallel.zero=1", " --set parallel.pp=2"}) {
    SCOPED_TRACE(mesh);
    std::string out;
    const auto clean = train(d, data.clean, "clean", "", &out, mesh);
    EXPECT_TRUE(spikes(clean).empty()) << out;
    EXPECT_EQ(out.find("loss spike"), std::string::npos) << out;
    const std::string ck = (d.path / "ck").string();
    fs::remove_all(ck);
    const auto rolled = train(d, data.spiky, "rolled",
                              "policy = \"rollback\"\n[checkpoint]\nevery = 4\ndir = \"" + ck + "\"\n", &out, mesh);
    ASSERT_EQ(spikes(rolled), (std::vector<std::pair<int64_t, std::string>>{{kSpikeStep, "rolled back"}})) << out;
    EXPECT_NE(out.find("rolled back to the checkpoint of step 12, dropping the batch of step 14"), std::string::npos)
        << out;
    const auto want = steps(clean), got = steps(rolled);
    ASSERT_EQ(got.size(), 20u);
    for (const auto& [step, v] : want) EXPECT_EQ(got.at(step), v) << "step " << step;
    // The final checkpoint carries the event and the dropped batch (the loader's
    // 13 batches before it: 13 x 8 windows of epoch 0).
    nlohmann::json m;
    std::ifstream(d.path / "ck" / "step_00000020" / "manifest.json") >> m;
    ASSERT_EQ(m["spike"]["dropped"].size(), 1u) << m["spike"].dump();
    EXPECT_EQ(m["spike"]["dropped"][0], (nlohmann::json{{"epoch", 0}, {"windows", 13 * kBatch}, {"step", kSpikeStep}}));
    ASSERT_EQ(m["spike"]["events"].size(), 1u);
    EXPECT_EQ(m["spike"]["events"][0]["to_step"], 12);
    fs::remove(d.path / "clean");
    fs::remove(d.path / "rolled");
  }
}

// Under skip the spike's update is dropped (the batch is spent): from then on
// the run trains what the clean run trains one step earlier, with the same
// learning rate (the optimizer's step count did not move). No dropout: the
// spent step would have drawn masks. Under log the run trains on and says so.
TEST(SpikeCli, SkipDropsTheUpdateAndLogTrainsOn) {
  Dir d;
  const Data data = write_data(d);
  const std::string no_dropout = " --set model.dropout=0";
  std::string out;
  const auto clean = steps(train(d, data.clean, "clean", "", &out, no_dropout));
  const auto skipped_lines = train(d, data.spiky, "skip", "policy = \"skip\"\n", &out, no_dropout);
  ASSERT_EQ(spikes(skipped_lines), (std::vector<std::pair<int64_t, std::string>>{{kSpikeStep, "update dropped"}}))
      << out;
  const auto skipped = steps(skipped_lines);
  for (int64_t s = 1; s < kSpikeStep; ++s) EXPECT_EQ(skipped.at(s), clean.at(s)) << "step " << s;
  for (int64_t s = kSpikeStep + 1; s <= 20; ++s) EXPECT_EQ(skipped.at(s), clean.at(s - 1)) << "step " << s;
  const auto logged = train(d, data.spiky, "log", "policy = \"log\"\n", &out, no_dropout);
  EXPECT_EQ(spikes(logged), (std::vector<std::pair<int64_t, std::string>>{{kSpikeStep, "trained on (policy log)"}}))
      << out;
  EXPECT_NE(steps(logged).at(kSpikeStep + 1), clean.at(kSpikeStep));
}

// The robust z-score against numbers worked by hand, and the detector's rules:
// non-finite values are spikes even before warmup, a spike stays out of the
// window, a flat window does not call a small rise a spike.
TEST(Spike, RobustZAndTheDetectorsRules) {
  // median 3, |x - 3| = {2, 1, 0, 1, 97}: MAD 1, scale 1.4826.
  EXPECT_NEAR(robust_z({1, 2, 3, 4, 100}, 6), 3 / 1.4826, 1e-12);
  EXPECT_NEAR(robust_z({5, 5, 5, 5}, 5.004), 0.004 / 0.005, 1e-9);  // MAD 0: the floor 1e-3 x median
  EXPECT_EQ(robust_z({}, 3), 0);
  SpikeOptions o;
  o.window = 4;
  o.warmup = 3;
  SpikeDetector det(o);
  EXPECT_TRUE(det.observe(std::nan(""), 1).spike);
  EXPECT_TRUE(det.observe(1, INFINITY).spike);
  for (double x : {1.0, 1.1, 0.9}) EXPECT_FALSE(det.observe(x, 1).spike);
  const SpikeVerdict v = det.observe(5, 1);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.reason.rfind("loss z ", 0), 0u) << v.reason;
  EXPECT_EQ(det.state()["loss"], (nlohmann::json{1.0, 1.1, 0.9}));  // the spike is not remembered
  EXPECT_FALSE(det.observe(1.05, 1).spike);
  SpikeDetector again(o);
  again.restore(det.state());
  EXPECT_EQ(again.state(), det.state());
  EXPECT_THROW(again.restore(nlohmann::json{{"loss", {1}}, {"grad_norm", {1, 2}}}), std::runtime_error);
}

// Settings that cannot work are one error before anything starts.
TEST(Spike, ConfigErrorsNameTheKeys) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NE(test::error_of(cfg, {"spike.policy=\"rollback\""}).find("set checkpoint.dir and checkpoint.every"),
            std::string::npos);
  EXPECT_NE(test::error_of(cfg, {"spike.policy=\"undo\""}).find("use off, log, skip or rollback"), std::string::npos);
  EXPECT_NE(test::error_of(cfg, {"spike.warmup=60"}).find("spike.warmup = 60 exceeds spike.window = 50"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
