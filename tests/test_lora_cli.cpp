// LoRA through `meshtrain train` ([lora] rank, alpha, dropout, targets): fine-
// tuning a pretrained checkpoint ([init] from) trains the adapters only. One
// process, dp 2 and tp 2 (SP) give the same losses (relative 1e-5: other
// reduction orders), and so does ZeRO-2 over dp 2 (the frozen base out of its
// flats); the run's checkpoints hold the adapters and their moments only (a
// quarter of the base's size or less) and name the base, which a resumed run
// and the merged export load from [init] from: stopping and resuming gives the
// uninterrupted losses (which a base that moved in training would break);
// ZeRO-3 or pp with LoRA is one error before ranks start.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/peft/nf4.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

TEST(LoraCli, FineTunesAdaptersOnly) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "l.toml", "") + " --set model.dropout=0.0";
  const std::string base = (d.path / "base").string();
  auto run = run_command(bin + " train " + cfg + " --set checkpoint.dir='\"" + base + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string lora = cfg + " --set init.from='\"" + base + "\"' --set lora.rank=4 --set lora.alpha=8 "
                                 "--set lora.targets='[\"all\"]' --set train.lr=3e-2";
  auto metrics = [&](const std::string& tag) { return " --set train.metrics='\"" + (d.path / tag).string() + "\"'"; };
  const std::pair<std::string, std::string> meshes[] = {
      {" --nproc 1", "one"}, {" --nproc 2", "dp2"}, {" --nproc 2 --set parallel.tp=2 --set parallel.sp=true", "tp2"},
      {" --nproc 2 --set parallel.zero=2", "zero2"}};
  for (const auto& [mesh, tag] : meshes) {
    const std::string ck = " --set checkpoint.dir='\"" + (d.path / ("ck_" + tag)).string() + "\"'";
    run = run_command(bin + " train " + lora + mesh + ck + metrics(tag));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("weights from " + base), std::string::npos) << run.output;
  }
  expect_same_losses((d.path / "one").string(), (d.path / "dp2").string(), 0, 6);
  expect_same_losses((d.path / "one").string(), (d.path / "tp2").string(), 0, 6);
  expect_same_losses((d.path / "one").string(), (d.path / "zero2").string(), 0, 6);
  const auto l = losses((d.path / "one").string());
  EXPECT_LT(std::stod(l.at(6)), std::stod(l.at(1)));  // the adapters learn

  // An adapter checkpoint: what trains, the base named (it is [init] from).
  ckpt::Reader pre(ckpt::resolve(base)), tuned(ckpt::resolve((d.path / "ck_dp2").string()));
  for (const char* name : {"model/layers.0.attn.q.weight", "model/layers.1.mlp.fc2.weight", "model/embed.weight"}) {
    EXPECT_FALSE(tuned.has(name)) << name;
  }
  EXPECT_EQ(tuned.manifest().at("base").at("from").get<std::string>(), base);
  auto bytes = [](const std::string& dir) {
    uintmax_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.is_regular_file() ? e.file_size() : 0;
    return n;
  };
  EXPECT_LT(bytes(tuned.dir()) * 4, bytes(pre.dir())) << "an adapter checkpoint is small";
  EXPECT_GT(tuned.read_full("model/layers.0.attn.q.lora_b").abs().max().item<double>(), 0);
  EXPECT_FALSE(tuned.has("optim/exp_avg/layers.0.attn.q.weight"));
  EXPECT_TRUE(tuned.has("optim/exp_avg/layers.0.attn.q.lora_a"));

  // Export: merged by default (W + (alpha / rank) B A, here 8 / 4), or the adapters alone.
  const std::string merged = (d.path / "merged.safetensors").string(), small = (d.path / "adapters.safetensors").string();
  run = run_command(bin + " ckpt export " + (d.path / "ck_dp2").string() + " --out " + merged);
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " ckpt export " + (d.path / "ck_dp2").string() + " --adapters-only --out " + small);
  ASSERT_EQ(run.code, 0) << run.output;
  {
    ckpt::SafetensorsFile m(merged), a(small);
    EXPECT_FALSE(m.has("layers.0.attn.q.lora_a"));
    const at::Tensor want = pre.read_full("model/layers.0.attn.q.weight") +
                            at::mm(tuned.read_full("model/layers.0.attn.q.lora_b"),
                                   tuned.read_full("model/layers.0.attn.q.lora_a")) * 2.0;
    EXPECT_TRUE(at::allclose(m.get("layers.0.attn.q.weight"), want, 1e-6, 1e-7));
    EXPECT_FALSE(a.has("layers.0.attn.q.weight"));
    EXPECT_TRUE(a.has("layers.1.mlp.fc2.lora_b"));
    EXPECT_LT(std::filesystem::file_size(small) * 4, std::filesystem::file_size(merged));
    EXPECT_NE(a.metadata().at("lora").find("\"rank\":4"), std::string::npos) << a.metadata().at("lora");
  }

  // Stop after 3 steps, resume: the uninterrupted run's losses.
  const std::string split = " --nproc 2 --set checkpoint.dir='\"" + (d.path / "split").string() + "\"'";
  run = run_command(bin + " train " + lora + split + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + lora + split + metrics("resumed"));
  ASSERT_EQ(run.code, 0) << run.output;
  expect_same_losses((d.path / "dp2").string(), (d.path / "resumed").string(), 3, 3);

  for (const std::string bad : {" --set parallel.zero=3", " --set parallel.pp=2", " --set lora.alpha=0",
                                " --set lora.targets='[\"attn.qq\"]'"}) {
    run = run_command(bin + " train " + lora + " --nproc 2" + bad);
    EXPECT_NE(run.code, 0) << bad;
    EXPECT_NE(run.output.find("lora"), std::string::npos) << bad << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a rank started: " << run.output;
  }
}

// Adapters are pinned to the step they were trained on (ckpt/pin.h), not to
// init.from's newest: LoRA from base/ (its step 3) stops at step 3; the base
// trains on to step 6; the LoRA run resumes on the pinned step 3 (the losses of
// a run from base/step_00000003 named outright) and eval loads that step too.
// It used to resolve base/ again at each load and took step 6. A base whose
// manifest changed, or that moved, is one error naming both, before any rank
// starts; init.from inside the run's own checkpoint.dir is refused.
TEST(LoraCli, AdaptersArePinnedToTheirBaseStep) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "p.toml", "") + " --nproc 1 --set model.dropout=0.0";
  auto ck = [&](const std::string& name) { return " --set checkpoint.dir='\"" + (d.path / name).string() + "\"'"; };
  auto metrics = [&](const std::string& tag) { return " --set train.metrics='\"" + (d.path / tag).string() + "\"'"; };
  auto lora_from = [&](const std::string& from) {
    return cfg + " --set init.from='\"" + (d.path / from).string() + "\"' --set lora.rank=4 --set lora.alpha=8 "
                 "--set lora.targets='[\"all\"]' --set train.lr=3e-2";
  };
  auto eval_loss = [&](const std::string& ckpt) {
    const auto r = run_command(bin + " eval " + (d.path / ckpt).string() + " --data " + (d.path / "train.bin").string());
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.find("train.bin: loss ");
    return at == std::string::npos ? r.output : r.output.substr(at);
  };
  auto run = run_command(bin + " train " + cfg + ck("base") + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + lora_from("base") + ck("lora") + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + lora_from("base/step_00000003") + ck("straight") + metrics("straight.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string at_step3 = eval_loss("lora");
  run = run_command(bin + " train " + cfg + ck("base"));  // the base trains on: base/ now reads as its step 6
  ASSERT_EQ(run.code, 0) << run.output;
  ASSERT_TRUE(std::filesystem::exists(d.path / "base/step_00000006"));
  EXPECT_EQ(eval_loss("lora"), at_step3);
  run = run_command(bin + " train " + lora_from("base") + ck("lora") + metrics("resumed.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  expect_same_losses((d.path / "straight.metrics").string(), (d.path / "resumed.metrics").string(), 3, 3);
  EXPECT_EQ(eval_loss("lora"), eval_loss("straight"));
  ckpt::Reader tuned(ckpt::resolve((d.path / "lora").string()));
  EXPECT_EQ(tuned.manifest().at("base").at("step_dir").get<std::string>(), (d.path / "base/step_00000003").string());

  const std::string manifest = (d.path / "base/step_00000003/manifest.json").string();
  std::ofstream(manifest, std::ios::app) << "\n";  // another manifest: other weights, as far as anyone can tell
  run = run_command(bin + " eval " + (d.path / "lora").string() + " --data " + (d.path / "train.bin").string());
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("whose manifest has changed since"), std::string::npos) << run.output;
  run = run_command(bin + " train " + lora_from("base") + ck("lora") + " --set train.steps=8");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find((d.path / "base/step_00000003").string() + " (init.from = "), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a rank started: " << run.output;
  std::filesystem::rename(d.path / "base/step_00000003", d.path / "moved");
  run = run_command(bin + " ckpt export " + (d.path / "lora").string() + " --out " + (d.path / "m.safetensors").string());
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("which is gone: it was moved or deleted"), std::string::npos) << run.output;
  run = run_command(bin + " train " + lora_from("base") + ck("base"));
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("lies in this run's checkpoint.dir"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a rank started: " << run.output;
}

// [adapters] bottleneck through `meshtrain train`: from a pretrained checkpoint,
// one process and dp 2 give the same losses (1e-5), the loss falls, the
// checkpoint holds the adapters and not the base; with LoRA or ZeRO-3 it is one error.
TEST(LoraCli, BottleneckAdaptersFineTune) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "a.toml", "") + " --set model.dropout=0.0";
  const std::string base = (d.path / "base").string();
  auto run = run_command(bin + " train " + cfg + " --set checkpoint.dir='\"" + base + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string tune = cfg + " --set init.from='\"" + base + "\"' --set adapters.bottleneck=8 --set train.lr=3e-2";
  for (const std::string n : {"1", "2"}) {
    run = run_command(bin + " train " + tune + " --nproc " + n + " --set checkpoint.dir='\"" +
                      (d.path / ("ck" + n)).string() + "\"' --set train.metrics='\"" + (d.path / ("m" + n)).string() +
                      "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
  }
  expect_same_losses((d.path / "m1").string(), (d.path / "m2").string(), 0, 6);
  const auto l = losses((d.path / "m2").string());
  EXPECT_LT(std::stod(l.at(6)), std::stod(l.at(1)));
  ckpt::Reader pre(ckpt::resolve(base)), tuned(ckpt::resolve((d.path / "ck2").string()));
  EXPECT_FALSE(tuned.has("model/layers.1.mlp.fc1.weight")) << "the frozen base stays in [init] from";
  EXPECT_GT(tuned.read_full("model/layers.1.adapter_mlp.up.weight").abs().max().item<double>(), 0);
  for (const std::string bad : {" --set lora.rank=4", " --set parallel.zero=3"}) {
    run = run_command(bin + " train " + tune + " --nproc 2" + bad);
    EXPECT_NE(run.code, 0) << bad;
    EXPECT_NE(run.output.find("adapters.bottleneck = 8"), std::string::npos) << bad << "\n" << run.output;
  }
}

// QLoRA through `meshtrain train` ([lora] quantize = "nf4"): the block linears
// of the [init] weights in NF4; one process = dp 2; --check-plan holds the
// planner's frozen-base, adapter, gradient and optimizer bytes (plan/posttrain.h)
// against the measured ones within 5%, for LoRA and QLoRA alike; the
// checkpoint holds no base linears (the manifest names the init weights), a
// stopped run resumes to the uninterrupted losses, and the merged export is
// dequant(quant(W)) + (alpha / rank) B A. Without init.from, or under tp, it is one error.
TEST(LoraCli, QloraTrainsResumesAndMatchesThePlan) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "q.toml", "") + " --set model.dropout=0.0";
  const std::string base = (d.path / "base").string();
  auto run = run_command(bin + " train " + cfg + " --set checkpoint.dir='\"" + base + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string lora = cfg + " --set init.from='\"" + base + "\"' --set lora.rank=4 --set lora.alpha=8 "
                                 "--set lora.targets='[\"all\"]' --set train.lr=1e-2";
  const std::string qlora = lora + " --set lora.quantize=nf4";
  auto sets = [&](const std::string& tag) {
    return " --set checkpoint.dir='\"" + (d.path / ("ck_" + tag)).string() + "\"' --set train.metrics='\"" +
           (d.path / tag).string() + "\"'";
  };
  for (const auto& [args, tag] : {std::pair{lora, "lora"}, {qlora, "qlora"}}) {
    run = run_command(bin + " train " + args + " --nproc 1 --check-plan" + sets(tag));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find(tag == std::string("qlora") ? "frozen base (NF4 linears)" : "frozen base"),
              std::string::npos) << run.output;
    EXPECT_NE(run.output.find("adapters"), std::string::npos) << run.output;
  }
  EXPECT_NE(run.output.find("QLoRA: block linears in NF4"), std::string::npos) << run.output;
  run = run_command(bin + " train " + qlora + " --nproc 2" + sets("qlora_dp2"));
  ASSERT_EQ(run.code, 0) << run.output;
  expect_same_losses((d.path / "qlora").string(), (d.path / "qlora_dp2").string(), 0, 6);
  const auto l = losses((d.path / "qlora").string()), full = losses((d.path / "lora").string());
  EXPECT_LT(std::stod(l.at(6)), std::stod(l.at(1)));
  // NF4 moves the loss a little from the fp32 base's, not a lot.
  EXPECT_NEAR(std::stod(l.at(1)), std::stod(full.at(1)), 0.05 * std::stod(full.at(1)));

  ckpt::Reader tuned(ckpt::resolve((d.path / "ck_qlora").string())), pre(ckpt::resolve(base));
  EXPECT_FALSE(tuned.has("model/layers.0.attn.q.weight"));
  EXPECT_TRUE(tuned.has("model/layers.0.attn.q.lora_b"));
  EXPECT_FALSE(tuned.has("model/embed.weight"));
  EXPECT_EQ(tuned.manifest().at("base").at("from").get<std::string>(), base);
  EXPECT_EQ(tuned.manifest().at("qlora").at("block").get<int>(), 64);

  const std::string merged = (d.path / "merged.safetensors").string();
  run = run_command(bin + " ckpt export " + (d.path / "ck_qlora").string() + " --out " + merged);
  ASSERT_EQ(run.code, 0) << run.output;
  {
    ckpt::SafetensorsFile m(merged);
    const at::Tensor w = pre.read_full("model/layers.1.mlp.fc1.weight");
    const at::Tensor want = nf4_dequantize(nf4_quantize(w, 64, true), at::kFloat) +
                            at::mm(tuned.read_full("model/layers.1.mlp.fc1.lora_b"),
                                   tuned.read_full("model/layers.1.mlp.fc1.lora_a")) * 2.0;
    EXPECT_TRUE(at::allclose(m.get("layers.1.mlp.fc1.weight"), want, 1e-6, 1e-7));
    EXPECT_FALSE(at::allclose(m.get("layers.1.mlp.fc1.weight"), w, 1e-4, 1e-6)) << "not the fp32 base";
  }

  // Stop after 3 steps, resume: the uninterrupted run's losses.
  const std::string split = " --nproc 2 --set checkpoint.dir='\"" + (d.path / "split").string() + "\"'";
  run = run_command(bin + " train " + qlora + split + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " train " + qlora + split + " --set train.metrics='\"" + (d.path / "resumed").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  expect_same_losses((d.path / "qlora_dp2").string(), (d.path / "resumed").string(), 3, 3);

  const std::pair<std::string, std::string> bad[] = {
      {cfg + " --set lora.rank=4 --set lora.quantize=nf4", "init.from (it is \"\")"},
      {qlora + " --set parallel.tp=2", "parallel.tp = 1 (it is 2)"},
      {qlora + " --set lora.quantize=int4", "use \"none\" or \"nf4\""}};
  for (const auto& [args, want] : bad) {
    run = run_command(bin + " train " + args + " --nproc 2");
    EXPECT_NE(run.code, 0) << args;
    EXPECT_NE(run.output.find(want), std::string::npos) << args << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace meshtrain::test
