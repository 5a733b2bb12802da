// Post-training through `meshtrain train` as a user runs it: chat data from
// `meshtrain tokenize chat`, SFT on it, preference pairs from `meshtrain
// tokenize prefs`, then DPO from the SFT checkpoint. Each method gives the same
// losses on one process, dp 2 and tp 2 (relative 1e-5: other reduction
// orders); DPO's metrics move the right way (the margin grows, the loss falls);
// DPO with LoRA and the adapters-disabled reference equals DPO with LoRA and an
// explicit frozen copy; a DPO run that cannot work is one error before ranks
// start.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

// `key` in metrics file `b` equals file `a`'s at each of a's `steps` steps (relative 1e-5).
void expect_same_metric(const std::string& a, const std::string& b, const std::string& key, size_t steps) {
  const auto x = metric(a, key), y = metric(b, key);
  ASSERT_EQ(x.size(), steps) << key << " in " << a;
  for (const auto& [step, v] : x) {
    ASSERT_TRUE(y.count(step)) << key << " step " << step << " in " << b;
    EXPECT_NEAR(v, y.at(step), 1e-5 * std::max(1.0, std::abs(v))) << b << " " << key << " " << step;
  }
}

// `command` + each case's settings fails in the launching process (no rank's
// output) with one error containing the case's message.
void expect_refused(const std::string& command, const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [set, want] : cases) {
    const auto run = run_command(command + set);
    EXPECT_NE(run.code, 0) << set;
    EXPECT_NE(run.output.find(want), std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;
  }
}

// `meshtrain tokenize task --name arithmetic` into DIR/arith (blocks of 32): its output.
std::string arithmetic_task(const Dir& d, int count) {
  const auto run = run_command(std::string(MESHTRAIN_BIN) + " tokenize task --name arithmetic --out " +
                               (d.path / "arith").string() + " --seq 32 --count " + std::to_string(count));
  EXPECT_EQ(run.code, 0) << run.output;
  return run.output;
}

TEST(PostTrainCli, SftThenDpoMatchAcrossMeshes) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string tokenizer = tiny_tokenizer(d, bin);
  {
    std::ofstream chats(d.path / "chats.jsonl"), pairs(d.path / "pairs.jsonl");
    for (int i = 0; i < 48; ++i) {
      const std::string q = "Quote verse " + std::to_string(i % 9);
      const std::string a = "In the beginning God created " + std::to_string(i % 17);
      chats << nlohmann::json{{"messages", {{{"role", "user"}, {"content", q}}, {{"role", "assistant"}, {"content", a}}}}}
                   .dump()
            << "\n";
      pairs << nlohmann::json{{"prompt", q}, {"chosen", a},
                              {"rejected", "the earth " + std::to_string((i + 5) % 17)}}
                   .dump()
            << "\n";
    }
  }
  auto run = run_command(bin + " tokenize chat --input " + (d.path / "chats.jsonl").string() + " --tokenizer " +
                         tokenizer + " --out " + (d.path / "sft").string() + " --seq 64");
  ASSERT_EQ(run.code, 0) << run.output;
  run = run_command(bin + " tokenize prefs --input " + (d.path / "pairs.jsonl").string() + " --tokenizer " +
                    tokenizer + " --out " + (d.path / "dpo").string() + " --seq 64");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("48 pairs -> 96 blocks of 64 tokens"), std::string::npos) << run.output;

  const std::string model = "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 400\ndropout = 0.0\n";
  // SFT at lr 1e-3: at 1e-2 the gradient norm spikes at step 3 (4.8 -> 20.5 -> 3.0) and magnifies
  // step 1's rounding (tp 2's norm within 2.4e-8) to 2.0e-5 there on an AMD EPYC (measured).
  const std::string sft = d.write("sft.toml", model + "[data]\ntrain = \"" + (d.path / "sft/train.bin").string() +
                                                  "\"\n[train]\nmethod = \"sft\"\nsteps = 4\nmicro_batch = 2\n"
                                                  "global_batch = 4\nseq = 64\nlr = 1e-3\nlog_every = 1\n");
  const std::string dpo = d.write("dpo.toml", model + "[data]\ntrain = \"" + (d.path / "dpo/train.bin").string() +
                                                  "\"\n[train]\nmethod = \"dpo\"\nsteps = 4\nmicro_batch = 2\n"
                                                  "global_batch = 4\nseq = 64\nlr = 1e-3\nwarmup = 0\nlog_every = 1\n"
                                                  "[dpo]\nbeta = 0.5\n");
  auto file = [&](const std::string& tag) { return (d.path / tag).string(); };
  auto sets = [&](const std::string& tag) {
    return " --set train.metrics='\"" + file(tag + ".jsonl") + "\"' --set checkpoint.dir='\"" + file("ck_" + tag) +
           "\"'";
  };
  const std::pair<std::string, std::string> meshes[] = {
      {" --nproc 1", "one"}, {" --nproc 2", "dp2"}, {" --nproc 2 --set parallel.tp=2 --set parallel.sp=true", "tp2"}};
  for (const auto& [mesh, tag] : meshes) {
    run = run_command(bin + " train " + sft + mesh + sets("sft_" + tag));
    ASSERT_EQ(run.code, 0) << run.output;
  }
  expect_same_losses(file("sft_one.jsonl"), file("sft_dp2.jsonl"), 0, 4);
  expect_same_losses(file("sft_one.jsonl"), file("sft_tp2.jsonl"), 0, 4);

  const std::string from = " --set init.from='\"" + file("ck_sft_one") + "\"'";
  for (const auto& [mesh, tag] : meshes) {
    run = run_command(bin + " train " + dpo + from + mesh + sets("dpo_" + tag));
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("| rewards/chosen "), std::string::npos) << run.output;
  }
  expect_same_losses(file("dpo_one.jsonl"), file("dpo_dp2.jsonl"), 0, 4);
  expect_same_losses(file("dpo_one.jsonl"), file("dpo_tp2.jsonl"), 0, 4);
  // The reference is the starting policy: zero rewards at step 1, log 2 loss; then the margin grows.
  const auto margin = metric(file("dpo_one.jsonl"), "margin"), loss = metric(file("dpo_one.jsonl"), "loss");
  EXPECT_NEAR(margin.at(1), 0, 1e-6);
  EXPECT_NEAR(loss.at(1), std::log(2.0), 1e-6);
  EXPECT_GT(margin.at(4), margin.at(1));
  EXPECT_LT(loss.at(4), loss.at(1));

  // LoRA: the adapters-disabled reference equals a frozen copy of the start.
  const std::string lora = " --set lora.rank=4 --set lora.targets='[\"all\"]' --set train.lr=5e-3";
  for (const char* ref : {"adapters", "copy"}) {
    run = run_command(bin + " train " + dpo + from + lora + " --nproc 2 --set dpo.reference=" + ref +
                      sets(std::string("lora_") + ref));
    ASSERT_EQ(run.code, 0) << run.output;
  }
  expect_same_losses(file("lora_adapters.jsonl"), file("lora_copy.jsonl"), 0, 4);
  const auto lora_margin = metric(file("lora_adapters.jsonl"), "margin");
  EXPECT_GT(lora_margin.at(4), lora_margin.at(1)) << lora_margin.at(2) << " " << lora_margin.at(3) << " "
                                                  << std::ifstream(file("lora_adapters.jsonl")).rdbuf();

  // What cannot work is one error in the launching process.
  const std::pair<std::string, std::string> bad[] = {
      {" --set parallel.pp=2", "needs each sequence whole on one rank"},
      {" --set dpo.reference=adapters", "set lora.rank or use dpo.reference = \"copy\""},
      {" --set dpo.loss=kto", "DPO loss \"kto\": use sigmoid, ipo or hinge"},
      {" --set data.train='\"" + file("sft/train.bin") + "\"'", "dpo.json"},
  };
  for (const auto& [set, want] : bad) {
    run = run_command(bin + " train " + dpo + " --nproc 2" + set);
    EXPECT_NE(run.code, 0) << set;
    EXPECT_NE(run.output.find(want), std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;
  }
}

// GRPO through `meshtrain train` on the shipped arithmetic task: rollouts are
// seeded per completion, so dp 2 and tp 2 generate what one process does and
// the losses, rewards and held-out accuracy agree (relative 1e-5); the log has the RL metrics, the
// checkpoint loads for `meshtrain eval task`; a reward command's scores are
// the rewards, and one that fails, prints a non-number or too few lines stops
// the run with one error naming it; G = 1 and a missing prompts file are one
// error before ranks start.
TEST(PostTrainCli, GrpoOneProcessEqualsDp2) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  arithmetic_task(d, 80);
  CommandResult run;
  const std::string cfg = d.write(
      "g.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n[rl]\nprompts = \"" +
                    (d.path / "arith/prompts.jsonl").string() + "\"\neval = \"" + (d.path / "arith/eval.jsonl").string() +
                    "\"\ngroup = 4\nmax_new = 4\neval_examples = 16\n[train]\nmethod = \"grpo\"\nsteps = 3\n"
                    "micro_batch = 4\nglobal_batch = 4\nlr = 1e-3\nlog_every = 1\neval_every = 3\n");
  for (const auto& [n, tag] : std::vector<std::pair<std::string, std::string>>{
           {"1", "1"}, {"2", "2"}, {"2 --set parallel.tp=2", "tp2"}}) {
    run = run_command(bin + " train " + cfg + " --nproc " + n + " --set train.metrics='\"" +
                      (d.path / ("m" + tag)).string() + "\"' --set checkpoint.dir='\"" + (d.path / ("ck" + tag)).string() +
                      "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("held-out accuracy"), std::string::npos) << run.output;
  }
  for (const char* key : {"loss", "reward", "accuracy", "completion_length", "eval_accuracy", "eval_sampled_accuracy"}) {
    const size_t steps = std::string(key).rfind("eval_", 0) == 0 ? 2 : 3;
    for (const char* other : {"m2", "mtp2"}) expect_same_metric((d.path / "m1").string(), (d.path / other).string(), key, steps);
  }
  // A reward command (rl/reward.h): its scores are the rewards; a failing or malformed one is one error, no hang.
  run = run_command(bin + " train " + cfg + " --nproc 2 --set rl.reward_command='\"sed s/.*/0.5/\"' --set "
                    "train.metrics='\"" + (d.path / "m_cmd").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  for (const auto& [step, v] : metric((d.path / "m_cmd").string(), "reward")) EXPECT_EQ(v, 0.5) << step;
  for (const auto& [command, want] : std::vector<std::pair<std::string, std::string>>{
           {"sed s/.*/x/", "output line 1 is 'x', not a number"}, {"false", "failed (exit status 1)"},
           {"sed -n 1s/.*/1/p", "printed 1 scores for 8 completions"}}) {
    run = run_command(bin + " train " + cfg + " --nproc 2 --set rl.reward_command='\"" + command + "\"'");
    EXPECT_NE(run.code, 0) << command;
    EXPECT_NE(run.output.find(want), std::string::npos) << command << "\n" << run.output;
  }
  run = run_command(bin + " eval task " + (d.path / "ck2").string() + " --data " + (d.path / "arith/eval.jsonl").string());
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("exact "), std::string::npos) << run.output;
  expect_refused(bin + " train " + cfg + " --nproc 2",
                 {{" --set rl.group=1", "at least 2 completions per prompt"},
                  {" --set rl.task=sorting", "rl.task = \"sorting\": use \"arithmetic\" or \"reverse\""},
                  {" --set rl.eval_examples=-1", "rl.eval_examples = -1 must be at least 1"},
                  {" --set rl.prompts='\"/nonexistent.jsonl\"'", "cannot read /nonexistent.jsonl"}});
}

// PPO (rl/ppo.h): actor, critic with a value head, frozen reference for the KL
// penalty; one process, dp 2 and tp 2 give the same losses, value losses,
// rewards and KL (the rollouts are seeded per completion, GAE's whitening uses
// the global batch's moments); one completion per prompt is allowed (the
// critic is the baseline); bad [ppo] values are one error before ranks start.
TEST(PostTrainCli, PpoOneProcessEqualsDp2) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  arithmetic_task(d, 80);
  CommandResult run;
  const std::string cfg = d.write(
      "p.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n[rl]\nprompts = \"" +
                    (d.path / "arith/prompts.jsonl").string() + "\"\neval = \"" + (d.path / "arith/eval.jsonl").string() +
                    "\"\ngroup = 2\nmax_new = 4\neval_examples = 8\nepochs = 2\nreward_command = \"awk '{ print length($0) % 7 / 7 }'\"\n"
                    "[ppo]\nkl_coef = 0.1\n"
                    "[train]\nmethod = \"ppo\"\nsteps = 3\nmicro_batch = 2\nglobal_batch = 4\nlr = 1e-3\nlog_every = 1\n"
                    "eval_every = 3\n");
  for (const auto& [n, tag] : std::vector<std::pair<std::string, std::string>>{
           {"1", "1"}, {"2", "2"}, {"2 --set parallel.tp=2", "tp2"}}) {
    run = run_command(bin + " train " + cfg + " --nproc " + n + " --set train.metrics='\"" +
                      (d.path / ("m" + tag)).string() + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("value loss"), std::string::npos) << run.output;
  }
  for (const char* key : {"loss", "value_loss", "value_mse", "reward", "kl", "clip_low", "clip_high", "entropy"}) {
    for (const char* other : {"m2", "mtp2"}) expect_same_metric((d.path / "m1").string(), (d.path / other).string(), key, 3);
  }
  // The memory ledger, measured after step 1: the critic is the actor plus its
  // value head (h + 1 = 129 parameters x 16 B: fp32 weight, gradient, two
  // moments); the frozen reference holds weights only (4 of the actor's 16 B).
  const double actor = metric((d.path / "m1").string(), "mem_actor").at(1);
  EXPECT_EQ(metric((d.path / "m1").string(), "mem_critic").at(1) - actor, 16.0 * 129);
  EXPECT_EQ(metric((d.path / "m1").string(), "mem_reference").at(1) * 4, actor);
  // The policy moves away from the reference after the first update: KL 0 at step 1, then not.
  const auto kl = metric((d.path / "m1").string(), "kl");
  EXPECT_NEAR(kl.at(1), 0.0, 1e-6);
  EXPECT_GT(std::abs(kl.at(3)), 1e-6);
  run = run_command(bin + " train " + cfg + " --nproc 1 --set rl.group=1 --set train.steps=1");
  ASSERT_EQ(run.code, 0) << run.output;
  // Multi-turn episodes with the calculator (rl/environment.h): dp 2 = one process too.
  for (const std::string n : {"1", "2"}) {
    run = run_command(bin + " train " + cfg + " --nproc " + n + " --set rl.environment='\"calculator\"' --set "
                      "rl.max_turns=3 --set train.metrics='\"" + (d.path / ("env" + n)).string() + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("turns "), std::string::npos) << run.output;
  }
  for (const char* key : {"loss", "value_loss", "reward", "turns", "truncated"}) {
    expect_same_metric((d.path / "env1").string(), (d.path / "env2").string(), key, 3);
  }
  for (const auto& [step, v] : metric((d.path / "env1").string(), "turns")) EXPECT_TRUE(v >= 1 && v <= 3) << step;
  expect_refused(bin + " train " + cfg + " --nproc 2",
                 {{" --set ppo.lambda=1.5", "ppo.lambda = 1.5 must be in [0, 1]"},
                  {" --set ppo.kl_estimator='\"k2\"'", "ppo.kl_estimator: KL estimator \"k2\": use k1 or k3"},
                  {" --set ppo.value_clip=0", "ppo.value_clip = 0 must be > 0"},
                  {" --set rl.environment='\"browser\"'", "rl.environment: environment \"browser\": use \"calculator\""},
                  {" --set rl.max_turns=0", "rl.max_turns = 0 must be at least 1"}});
}

// RL runs resume (issue 41, item 6): PPO stopped after step 2 (train.stop_after)
// on dp 2 and resumed gives the uninterrupted run's steps 3 and 4 bitwise (the
// checkpoint holds the actor, the critic under "critic/", their moments, the
// spike detector and the config; rollouts are a function of seed, step and
// rank; dropout's masks are keyed by the step). The keys of
// training on data that RL cannot use are one error each before ranks start.
TEST(PostTrainCli, RlRunsStopAndResume) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  arithmetic_task(d, 80);
  const std::string cfg = d.write(
      "r.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.1\n[rl]\nprompts = \"" +
                    (d.path / "arith/prompts.jsonl").string() + "\"\ngroup = 2\nmax_new = 4\nepochs = 2\n"
                    "reward_command = \"awk '{ print length($0) % 7 / 7 }'\"\n[ppo]\nkl_coef = 0.1\n"
                    "[train]\nmethod = \"ppo\"\nsteps = 4\nmicro_batch = 2\nglobal_batch = 4\nlr = 1e-3\nlog_every = 1\n");
  auto train = [&](const std::string& set, const std::string& tag) {
    const auto r = run_command(bin + " train " + cfg + set + " --set train.metrics='\"" + (d.path / tag).string() + "\"'");
    EXPECT_EQ(r.code, 0) << r.output;
    return r.output;
  };
  train(" --nproc 2", "straight");
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"'";
  train(" --nproc 2 --set train.stop_after=2" + ck, "first");
  ASSERT_TRUE(std::filesystem::exists(d.path / "ck/step_00000002"));
  {
    ckpt::Reader r(ckpt::resolve((d.path / "ck").string()));
    EXPECT_TRUE(r.has("critic/model/value_head.weight"));
    EXPECT_TRUE(r.has("model/layers.0.attn.q.weight"));
    EXPECT_NE(r.manifest().at("config_toml").get<std::string>().find("method = \"ppo\""), std::string::npos);
  }
  const std::string resumed = train(" --nproc 2" + ck, "second");
  EXPECT_NE(resumed.find("resumed from " + (d.path / "ck/step_00000002").string()), std::string::npos) << resumed;
  for (const char* key : {"loss", "value_loss", "reward", "kl", "grad_norm"}) {
    const auto a = metric((d.path / "straight").string(), key), b = metric((d.path / "second").string(), key);
    ASSERT_EQ(b.size(), 2u) << key;
    for (const auto& [step, v] : b) EXPECT_EQ(v, a.at(step)) << key << " step " << step;
  }
  expect_refused(bin + " train " + cfg + " --nproc 2",
                 {{" --set check.replicas_every=1", "check.replicas_every = 1: the replica check runs in training on data"},
                  {" --set eval.tasks='[\"x.jsonl\"]'", "drop eval.tasks"},
                  {" --set data.val='[\"x.bin\"]'", "drop data.val"},
                  {" --set spike.policy='\"skip\"'", "logs spikes of the actor's updates only"}});
}

// A learned reward model (rl/reward_model.h) on tokenize task's preference
// pairs: dp 2 and tp 2 = one process in training and in scoring PPO's episodes; PPO then holds four models (actor, critic,
// reference, reward), their bytes measured, and scores completions with the
// reward model; a checkpoint without a value head is one error before ranks start.
TEST(PostTrainCli, RewardModelThenPpoWithFourModels) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string made = arithmetic_task(d, 200);
  CommandResult run;
  EXPECT_NE(made.find("200 preference pairs in prefs/"), std::string::npos) << made;
  const std::string rm = d.write(
      "rm.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n[data]\ntrain = \"" +
                     (d.path / "arith/prefs/train.bin").string() +
                     "\"\n[train]\nmethod = \"reward\"\nsteps = 6\nseq = 32\nmicro_batch = 2\nglobal_batch = 4\n"
                     "lr = 1e-3\nlog_every = 1\n");
  for (const std::string n : {"1", "2"}) {
    run = run_command(bin + " train " + rm + " --nproc " + n + " --set train.metrics='\"" + (d.path / ("rm" + n)).string() +
                      "\"' --set checkpoint.dir='\"" + (d.path / ("rmck" + n)).string() + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("score/chosen"), std::string::npos) << run.output;
  }
  for (const char* key : {"loss", "margin", "accuracy", "score/chosen"}) {
    expect_same_metric((d.path / "rm1").string(), (d.path / "rm2").string(), key, 6);
  }
  // tp 2 = one process, on the Llama shape: GPT's key bias has a gradient that is
  // zero in exact arithmetic, so Adam turns each layout's rounding noise into
  // lr-sized steps of either sign (1.8e-5 apart after 6 steps, a property of the
  // model, not of tp); without biases the layouts agree to 1e-6.
  for (const auto& [n, tag] : std::vector<std::pair<std::string, std::string>>{{"1", "l1"}, {"2 --set parallel.tp=2", "ltp2"}}) {
    run = run_command(bin + " train " + rm + " --nproc " + n + " --set model.preset='\"llama-tiny\"' --set train.metrics='\"" +
                      (d.path / tag).string() + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
  }
  for (const char* key : {"loss", "margin", "accuracy", "score/chosen", "score/rejected"}) {
    expect_same_metric((d.path / "l1").string(), (d.path / "ltp2").string(), key, 6);
  }
  const std::string ppo = d.write(
      "p.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n[rl]\nprompts = \"" +
                    (d.path / "arith/prompts.jsonl").string() + "\"\ngroup = 2\nmax_new = 4\nreward_model = \"" +
                    (d.path / "rmck2").string() +
                    "\"\n[train]\nmethod = \"ppo\"\nsteps = 2\nseq = 32\nmicro_batch = 4\nglobal_batch = 4\n"
                    "lr = 1e-3\nlog_every = 1\n");
  run = run_command(bin + " train " + ppo + " --nproc 2 --set train.metrics='\"" + (d.path / "ppo").string() +
                    "\"' --set checkpoint.dir='\"" + (d.path / "ppock").string() + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  for (const char* line : {"actor (trained)", "critic (trained)", "reference (frozen)", "reward (frozen)"}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  }
  // The reward model scores alike when it is split over tp (one process = dp 2 = tp 2).
  for (const auto& [n, tag] : std::vector<std::pair<std::string, std::string>>{{"1", "1"}, {"2 --set parallel.tp=2", "tp2"}}) {
    run = run_command(bin + " train " + ppo + " --nproc " + n + " --set train.metrics='\"" +
                      (d.path / ("ppo" + tag)).string() + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    for (const char* key : {"reward", "loss", "value_loss"}) {
      expect_same_metric((d.path / ("ppo" + tag)).string(), (d.path / "ppo").string(), key, 2);
    }
  }
  // The reward model's weights: the reference's plus its value head (129 fp32 numbers).
  const auto mem = [&](const char* k) { return metric((d.path / "ppo").string(), k).at(1); };
  EXPECT_EQ(mem("mem_reward") - mem("mem_reference"), 4.0 * 129);
  // Its scores are real numbers, not the task's {0, 0.1, 1, 1.1}.
  const double reward = metric((d.path / "ppo").string(), "reward").at(1);
  for (double task : {0.0, 0.1, 1.0, 1.1}) EXPECT_GT(std::abs(reward - task), 1e-6);
  expect_refused(bin + " train " + ppo + " --nproc 2",
                 {{" --set rl.reward_model='\"" + (d.path / "rmck2").string() + "\"' --set rl.reward_command='\"cat\"'",
                   "rl.reward_command and rl.reward_model both set"},
                  {" --set train.steps=1 --set rl.reward_model='\"" + (d.path / "nothing").string() + "\"'", "nothing"},
                  {" --set rl.reward_model='\"" + (d.path / "ppock").string() + "\"'", "is not a reward model"}});
}

}  // namespace
}  // namespace meshtrain::test
