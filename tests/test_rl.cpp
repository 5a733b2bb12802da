// Reinforcement learning pieces (rl/): GRPO's group advantages, k3 KL and
// clipped loss in each aggregation equal hand computations (and the gradient
// of an unclipped token is −A w / denominator); rollouts: a row's completion
// does not depend on its batch (batched = one at a time, same seeds), the
// log-probabilities recomputed by a full forward equal the rollout's (ratio 1),
// rows stop on their stop token or stop sequence and are masked after it.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <set>

#include "meshtrain/comm/comm.h"
#include "tests/tiny_model.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/rl/evaluate.h"
#include "meshtrain/rl/grpo_objective.h"
#include "meshtrain/train/step.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/grpo.h"
#include "meshtrain/rl/reward.h"
#include "meshtrain/platform/subprocess.h"
#include "meshtrain/rl/rollout.h"

namespace meshtrain {
namespace {

at::Tensor vec(std::vector<double> v) { return at::tensor(v, at::kDouble); }

TEST(Grpo, GroupAdvantagesByHand) {
  const at::Tensor r = vec({1, 0, 0, 1, 2, 2, 2, 2});
  const at::Tensor a = group_advantages(r, 4);
  const double sd = std::sqrt(4 * 0.25 / 3);  // Bessel: (Σ (r − 0.5)²) / (4 − 1)
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(a[i].item<double>(), (i == 0 || i == 3 ? 0.5 : -0.5) / (sd + 1e-4), 1e-12);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[i].item<double>(), 0) << "a group with equal rewards learns nothing";
  const at::Tensor none = group_advantages(r, 4, false);
  EXPECT_NEAR(none[0].item<double>(), 0.5, 1e-12);
  EXPECT_THROW(group_advantages(r, 1), std::invalid_argument);
  EXPECT_THROW(group_advantages(r, 3), std::invalid_argument);
  EXPECT_THROW(parse_grpo_loss("ppo"), std::invalid_argument);
}

TEST(Grpo, K3AndTheClippedLossByHand) {
  EXPECT_NEAR(k3_kl(vec({-1.0}), vec({-1.5}))[0].item<double>(), std::exp(-0.5) + 0.5 - 1, 1e-12);
  EXPECT_EQ(k3_kl(vec({-2.0}), vec({-2.0}))[0].item<double>(), 0);
  // Two completions of three tokens; the second's last token masked (after its stop).
  const std::vector<std::vector<double>> lp = {{-1.0, -0.5, -2.0}, {-0.3, -1.2, -0.7}};
  const std::vector<std::vector<double>> old = {{-1.1, -0.9, -2.0}, {-0.1, -1.2, -0.2}};
  const std::vector<std::vector<double>> ref = {{-1.2, -0.4, -1.8}, {-0.5, -1.0, -0.9}};
  const std::vector<std::vector<double>> mask = {{1, 1, 1}, {1, 1, 0}};
  const std::vector<double> adv = {1.5, -0.8};
  const double beta = 0.05, eps = 0.2;
  std::vector<std::vector<double>> L(2, std::vector<double>(3));
  double clip_low = 0, clip_high = 0, kl = 0, n = 0;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      const double w = std::exp(lp[b][t] - old[b][t]), c = std::min(std::max(w, 1 - eps), 1 + eps);
      const double d = ref[b][t] - lp[b][t], k = std::exp(d) - d - 1;
      L[b][t] = -std::min(w * adv[b], c * adv[b]) + beta * k;
      if (mask[b][t] == 0) continue;
      n += 1, kl += k, clip_low += (w < 1 - eps && adv[b] < 0), clip_high += (w > 1 + eps && adv[b] > 0);
    }
  }
  auto masked_sum = [&](int b) { return L[b][0] * mask[b][0] + L[b][1] * mask[b][1] + L[b][2] * mask[b][2]; };
  const double want[] = {(masked_sum(0) / 3 + masked_sum(1) / 2) / 2, (masked_sum(0) + masked_sum(1)) / n,
                         (masked_sum(0) + masked_sum(1)) / (2 * 4), (masked_sum(0) + masked_sum(1)) / 10};
  const GrpoLoss kinds[] = {GrpoLoss::Grpo, GrpoLoss::Bnpo, GrpoLoss::DrGrpo, GrpoLoss::Dapo};
  for (int k = 0; k < 4; ++k) {
    at::Tensor logp = at::tensor({-1.0, -0.5, -2.0, -0.3, -1.2, -0.7}, at::kDouble).view({2, 3}).requires_grad_();
    GrpoOptions o;
    o.beta = beta;
    o.loss = kinds[k];
    o.max_completion = 4;
    const GrpoTerms t = grpo_loss(logp, at::tensor({-1.1, -0.9, -2.0, -0.1, -1.2, -0.2}, at::kDouble).view({2, 3}),
                                  at::tensor({-1.2, -0.4, -1.8, -0.5, -1.0, -0.9}, at::kDouble).view({2, 3}),
                                  vec(adv), at::tensor({1.0, 1.0, 1.0, 1.0, 1.0, 0.0}, at::kDouble).view({2, 3}), o, 10);
    EXPECT_NEAR(t.loss.item<double>(), want[k], 1e-12) << k;
    EXPECT_NEAR(t.kl, kl / n, 1e-12);
    EXPECT_NEAR(t.clip_low, clip_low / n, 1e-12);
    EXPECT_NEAR(t.clip_high, clip_high / n, 1e-12);
    if (kinds[k] == GrpoLoss::Bnpo) {
      t.loss.backward();
      // Token (0, 0): w = e^0.1 inside the clip range, A > 0: dL/dlp = (−A w + β (1 − e^d)) / n.
      const double w = std::exp(0.1), d = -1.2 + 1.0;
      EXPECT_NEAR(logp.grad()[0][0].item<double>(), (-adv[0] * w + beta * (1 - std::exp(d))) / n, 1e-12);
      // A masked token gets no gradient.
      EXPECT_EQ(logp.grad()[1][2].item<double>(), 0);
      // Token (0, 1): w = e^0.4 clipped at 1.2 with A > 0: only the KL term's gradient.
      const double d1 = -0.4 + 0.5;
      EXPECT_NEAR(logp.grad()[0][1].item<double>(), beta * (1 - std::exp(d1)) / n, 1e-12);
    }
  }
}

plan::ModelSpec spec() { return test::tiny_llama(96, 32); }

TEST(Rollout, BatchedEqualsOneAtATimeAndRecomputedLogprobsMatch) {
  Comm solo("solo", 0);
  Transformer m(spec(), solo, false, 3);
  const at::Tensor prompts = at::tensor({5, 17, 42, 8, 5, 17, 42, 8, 1, 2, 3, 4, 60, 61, 62, 63}, at::kLong).view({4, 4});
  RolloutOptions o;
  o.sample.max_new_tokens = 12;
  o.sample.temperature = 1.0;
  const std::vector<uint64_t> seeds{11, 12, 13, 14};
  const Rollout all = rollout(m, prompts, o, seeds);
  EXPECT_EQ(all.tokens.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_FALSE(at::equal(all.tokens[0], all.tokens[1])) << "rows 0 and 1 share a prompt but not a seed";
  for (int64_t b = 0; b < 4; ++b) {
    const Rollout one = rollout(m, prompts.narrow(0, b, 1), o, {seeds[b]});
    EXPECT_TRUE(at::equal(one.tokens[0], all.tokens[b])) << "row " << b;
    EXPECT_TRUE(at::allclose(one.logprobs[0], all.logprobs[b], 1e-5, 1e-5)) << "row " << b;
  }
  // The training step's recomputation (no cache, whole rows) gives the rollout's log-probs: ratio 1.
  const at::Tensor re = completion_logprobs(m, all.tokens, 4, 1.0);
  EXPECT_LT((re - all.logprobs).abs().max().item<double>(), 1e-5);
  // At another temperature too.
  o.sample.temperature = 0.7;
  const Rollout cool = rollout(m, prompts, o, seeds);
  EXPECT_LT((completion_logprobs(m, cool.tokens, 4, 0.7) - cool.logprobs).abs().max().item<double>(), 1e-5);
  // And with tiled attention (the decode step's queries sit past the cached keys).
  plan::ModelSpec tiled_spec = spec();
  tiled_spec.attention = plan::AttentionImpl::Tiled;
  Transformer tiled(tiled_spec, solo, false, 3);
  o.sample.temperature = 1.0;
  const Rollout t = rollout(tiled, prompts, o, seeds);
  EXPECT_TRUE(at::equal(t.tokens, all.tokens)) << "tiled and naive attention sample the same completions";
  EXPECT_LT((completion_logprobs(tiled, t.tokens, 4, 1.0) - t.logprobs).abs().max().item<double>(), 1e-5);
}

TEST(Rollout, RowsStopAndAreMaskedAfter) {
  Comm solo("solo", 0);
  Transformer m(spec(), solo, false, 3);
  const at::Tensor prompts = at::tensor({5, 17, 42, 1, 2, 3}, at::kLong).view({2, 3});
  RolloutOptions o;
  o.sample.max_new_tokens = 10;
  o.sample.temperature = 1.0;
  o.pad = 95;
  const Rollout free = rollout(m, prompts, o, {1, 2});
  EXPECT_EQ(free.lengths[0].item<int64_t>(), 10);
  // Stop on row 0's third token: row 0 ends there; row 1 runs on unless it meets it too.
  o.sample.stop_token = free.tokens[0][3 + 2].item<int64_t>();
  const Rollout stopped = rollout(m, prompts, o, {1, 2});
  EXPECT_EQ(stopped.lengths[0].item<int64_t>(), 3);
  EXPECT_EQ(stopped.mask[0].sum().item<double>(), 3);
  EXPECT_EQ(stopped.tokens[0][3 + 3].item<int64_t>(), 95);
  EXPECT_EQ(stopped.logprobs[0][5].item<double>(), 0);
  EXPECT_TRUE(at::equal(stopped.tokens[0].narrow(0, 0, 6), free.tokens[0].narrow(0, 0, 6)));
  // A stop sequence: row 1's tokens 2 and 3.
  o.sample.stop_token = -1;
  o.stop_sequences = {{free.tokens[1][3 + 1].item<int64_t>(), free.tokens[1][3 + 2].item<int64_t>()}};
  const Rollout seq = rollout(m, prompts, o, {1, 2});
  EXPECT_LE(seq.lengths[1].item<int64_t>(), 3);
  EXPECT_THROW(rollout(m, prompts, o, {1}), std::invalid_argument);
  o.sample.max_new_tokens = 30;
  EXPECT_THROW(rollout(m, prompts, o, {1, 2}), std::invalid_argument);
}

// GRPO through the step: a rollout batch of one group of 4, two rewarded;
// after one AdamW step the rewarded completions are more likely and the others
// less; the step's loss is the hand-computed dapo loss at ratio 1 (−Σ m A / Σ m).
TEST(Grpo, OneStepMovesProbabilityTowardTheRewarded) {
  Comm solo("solo", 0);
  Transformer m(spec(), solo, false, 3);
  const at::Tensor prompts = at::tensor({5, 17, 42, 8, 5, 17, 42, 8, 5, 17, 42, 8, 5, 17, 42, 8}, at::kLong).view({4, 4});
  RolloutOptions ro;
  ro.sample.max_new_tokens = 6;
  ro.sample.temperature = 1.0;
  const Rollout r = rollout(m, prompts, ro, {1, 2, 3, 4});
  RolloutBatch b;
  b.tokens = r.tokens;
  const int64_t S = r.tokens.size(1);
  b.old_logp = at::zeros({4, S - 1});
  b.mask = at::zeros({4, S - 1});
  b.old_logp.narrow(1, 3, 6).copy_(r.logprobs);
  b.mask.narrow(1, 3, 6).copy_(r.mask);
  b.advantages = group_advantages(at::tensor({1.0, 0.0, 1.0, 0.0}), 4).to(at::kFloat);
  GrpoOptions go;
  GrpoObjective objective(go, 1.0, 0, nullptr);
  objective.set_rollouts(b);
  AdamWOptions ao;
  ao.lr = 1e-2;
  ao.weight_decay = 0;
  AdamW opt(m.params().params(), ao);
  StepOptions so;
  so.objective = &objective;
  TrainStep step(m, opt, solo, solo, so);
  const at::Tensor before = completion_logprobs(m, r.tokens, 4, 1.0).sum(1);
  const StepResult res = step.run({objective.rows({0, 1}), objective.rows({2, 3})});
  // Entropy: the policy's, over the completion tokens, between 0 and log V.
  ASSERT_EQ(res.metrics.size(), 4u);
  EXPECT_EQ(res.metrics[3].first, "entropy");
  EXPECT_GT(res.metrics[3].second, 0);
  EXPECT_LT(res.metrics[3].second, std::log(96.0) + 1e-6);
  const at::Tensor after = completion_logprobs(m, r.tokens, 4, 1.0).sum(1);
  const double a = b.advantages[0].item<double>();
  EXPECT_NEAR(res.loss, -(a * 6 * 2 - a * 6 * 2) / 24, 1e-6);  // ratio 1: −Σ m A / Σ m = 0 for a balanced group
  EXPECT_GT(a, 0);
  for (int64_t i = 0; i < 4; ++i) {
    if (i % 2 == 0) EXPECT_GT(after[i].item<double>(), before[i].item<double>()) << "rewarded row " << i;
    if (i % 2 == 1) EXPECT_LT(after[i].item<double>(), before[i].item<double>()) << "unrewarded row " << i;
  }
}

// The shipped tasks: answers right, rewards as documented, the vocabulary
// closed, the examples a function of the seed, bad files one error.
TEST(Tasks, ExamplesRewardsAndVocabulary) {
  const auto a = task_examples("arithmetic", 5, 200, 2), again = task_examples("arithmetic", 5, 200, 2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, again[i].prompt);
    const auto& p = a[i].prompt;
    const size_t op = p.find_first_of("+-*", 1);
    const long x = std::stol(p.substr(0, op)), y = std::stol(p.substr(op + 1, p.size() - op - 2));
    const long want = p[op] == '+' ? x + y : p[op] == '-' ? x - y : x * y;
    EXPECT_EQ(a[i].answer, std::to_string(want)) << p;
    EXPECT_GE(want, 0) << p;
    EXPECT_LT(x, 100);
  }
  EXPECT_NE(task_examples("arithmetic", 6, 5, 2)[0].prompt + task_examples("arithmetic", 6, 5, 2)[1].prompt,
            a[0].prompt + a[1].prompt);
  const auto r = task_examples("reverse", 1, 20, 5);
  for (const auto& e : r) EXPECT_EQ(std::string(e.answer.rbegin(), e.answer.rend()) + "=", e.prompt.substr(4));
  EXPECT_THROW(task_examples("sorting", 1, 1, 2), std::invalid_argument);
  EXPECT_THROW(task_examples("arithmetic", 1, 1, 0), std::invalid_argument);
  EXPECT_EQ(CharVocab::decode(CharVocab::encode("12+7=\nrev:ab")), "12+7=\nrev:ab");
  EXPECT_THROW(CharVocab::encode("A"), std::invalid_argument);
  const TaskExample e{"12+7=", "19"};
  auto ids = [](const std::string& s) { return CharVocab::encode(s); };
  EXPECT_EQ(task_reward(ids("19\n"), e).total(), 1.1);
  EXPECT_EQ(task_reward(ids("19"), e).total(), 1.0) << "no end token: no format reward";
  EXPECT_EQ(task_reward(ids("18\n"), e).total(), 0.1);
  EXPECT_EQ(task_reward(ids("1a\n"), e).total(), 0.0);
  EXPECT_EQ(task_reward(ids("\n"), e).total(), 0.0);
  EXPECT_EQ(task_reward(ids("19\n55"), e).total(), 1.1) << "what follows the end does not count";
}

// A preference pair's rejected answer: wrong, of the answer's kind and length,
// no leading zero on a multi-digit number.
TEST(Tasks, NearMissesAreWrongAnswersOfTheSameKind) {
  for (const auto& e : task_examples("arithmetic", 4, 300, 2)) {
    for (uint64_t seed : {1, 2, 3}) {
      const std::string w = near_miss(e, seed);
      EXPECT_NE(w, e.answer);
      EXPECT_EQ(w.size(), e.answer.size());
      EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](char c) { return std::isdigit(c) != 0; })) << w;
      if (w.size() > 1) EXPECT_NE(w[0], '0') << e.answer << " -> " << w;
    }
  }
  for (const auto& e : task_examples("reverse", 4, 100, 5)) {
    const std::string w = near_miss(e, 9);
    EXPECT_NE(w, e.answer);
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](char c) { return std::islower(c) != 0; })) << w;
  }
}

// tokenize task's split: held-out prompts are distinct and never trained on
// (neither SFT nor RL prompts), even where the problem space is small.
TEST(Tasks, HeldOutPromptsAreNeitherTrainedNorRlPrompts) {
  for (int digits : {1, 2}) {
    const TaskSplit s = task_split("arithmetic", 3, 800, digits);
    std::set<std::string> eval;
    for (const auto& e : s.eval) EXPECT_TRUE(eval.insert(e.prompt).second) << "duplicate " << e.prompt;
    for (const auto* part : {&s.train, &s.prompts}) {
      for (const auto& e : *part) EXPECT_EQ(eval.count(e.prompt), 0u) << e.prompt << " digits " << digits;
    }
    if (digits == 2) {
      EXPECT_EQ(s.train.size(), 800u);
      EXPECT_EQ(s.prompts.size(), 201u);
      EXPECT_GT(s.eval.size(), 190u);
    }
  }
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// rl.reward_command is split into words as a shell would split them, expanding nothing.
TEST(RewardCommand, WordsAreSplitWithoutAShell) {
  using V = std::vector<std::string>;
  EXPECT_EQ(command_words("awk '{ print length($0) % 7 / 7 }'", "rl.reward_command"), (V{"awk", "{ print length($0) % 7 / 7 }"}));
  EXPECT_EQ(command_words("  a  \"b \\\"c\\\"\"  d\\ e $HOME;x ", "rl.reward_command"), (V{"a", "b \"c\"", "d e", "$HOME;x"}));
  for (const char* bad : {"", "   ", "awk '{", "a \"b", "a\\"}) EXPECT_THROW(command_words(bad, "rl.reward_command"), std::invalid_argument) << bad;
}

struct RewardRun {
  std::vector<TaskExample> ex{{"1+1=", "2"}, {"2+2=", "4"}};
  std::vector<std::vector<int64_t>> done{CharVocab::encode("2"), CharVocab::encode("5")};
  // TMPDIR of its own: the scratch directories the calls leave (none) are countable.
  fs::path tmp = fs::temp_directory_path() / ("meshtrain_reward_test_" + std::to_string(getpid()));
  RewardRun() {
    fs::create_directories(tmp);
    setenv("TMPDIR", tmp.c_str(), 1);
  }
  ~RewardRun() {
    unsetenv("TMPDIR");
    fs::remove_all(tmp);
  }
  std::string error(const RewardCommand& c) {
    try {
      command_rewards(c, ex, done);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  size_t left_behind() const { return static_cast<size_t>(std::distance(fs::directory_iterator(tmp), {})); }
};

// No shell sees the command (metacharacters are words); its files live in a private directory
// removed after each call; a command that hangs is killed at rl.reward_timeout; one that
// cannot start is named. With rl.reward_shell the shell runs it.
TEST(RewardCommand, RunsWithoutAShellInAPrivateDirectoryWithATimeout) {
  RewardRun r;
  EXPECT_EQ(command_rewards({"awk '{ print length($0) % 7 / 7 }'"}, r.ex, r.done).size(), 2u);
  const fs::path planted = r.tmp / "planted";
  EXPECT_NE(r.error({"echo 1; touch " + planted.string()}).find("not a number"), std::string::npos);
  EXPECT_FALSE(fs::exists(planted)) << "a shell ran the command";
  EXPECT_EQ(command_rewards({"sed s/.*/0.5/ | cat", true}, r.ex, r.done), (std::vector<double>{0.5, 0.5}));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(r.error({"sleep 30", false, 0.3}).find("did not finish within 0.3 s (rl.reward_timeout); killed"),
            std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  EXPECT_NE(r.error({"no-such-program-xyz 1"}).find("cannot start 'no-such-program-xyz': No such file or directory"),
            std::string::npos)
      << r.error({"no-such-program-xyz 1"});
  EXPECT_EQ(r.left_behind(), 0u) << "scratch directories were left in " << r.tmp;
}

}  // namespace
}  // namespace meshtrain
