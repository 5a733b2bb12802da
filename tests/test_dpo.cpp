// DPO (dpo/dpo.h): the loss, rewards, margin and accuracy equal a hand
// computation on a two-pair batch for each variant, and the gradient is the
// paper's (−β σ(−h) / n on the chosen log-prob); sequence log-probs are sums
// of log-softmax entries; with LoRA, the policy with adapters disabled as the
// reference gives exactly what an explicit frozen copy gives. Preference data
// (data/preference.h): two blocks per pair, chosen first, only the answers
// trained; the loader keeps a pair's windows together (group 2) and splits
// pairs over dp ranks as one process would; DpoObjective through TrainStep
// gives the hand-computed loss and metrics.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <set>

#include "meshtrain/comm/comm.h"
#include "tests/tiny_model.h"
#include "meshtrain/data/preference.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/dpo/dpo.h"
#include "meshtrain/train/step.h"
#include "tests/train_cli.h"

namespace meshtrain {
namespace {

at::Tensor vec(std::initializer_list<double> v) { return at::tensor(std::vector<double>(v), at::kDouble); }

TEST(Dpo, TwoPairsByHand) {
  const double beta = 0.5;
  // Rewards: chosen 0.5 x (0.2, 0.2) = (0.1, 0.1); rejected 0.5 x (-0.1, 0.1) = (-0.05, 0.05); h = (0.15, 0.05).
  const at::Tensor rc = vec({-1.2, -2.2}), rr = vec({-1.4, -1.1});
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  const double want[] = {(std::log1p(std::exp(-0.15)) + std::log1p(std::exp(-0.05))) / 2,  // sigmoid
                         ((0.3 - 1.0) * (0.3 - 1.0) + (0.1 - 1.0) * (0.1 - 1.0)) / 2,     // ipo: h / beta = 0.3, 0.1
                         ((1 - 0.15) + (1 - 0.05)) / 2};                                  // hinge
  const DpoLoss kinds[] = {DpoLoss::Sigmoid, DpoLoss::Ipo, DpoLoss::Hinge};
  for (int k = 0; k < 3; ++k) {
    at::Tensor pc = vec({-1.0, -2.0}).requires_grad_(), pr = vec({-1.5, -1.0}).requires_grad_();
    const DpoResult r = dpo_loss(pc, pr, rc, rr, beta, kinds[k]);
    EXPECT_NEAR(r.loss.item<double>(), want[k], 1e-12) << k;
    EXPECT_NEAR(r.chosen_reward, 0.1, 1e-12);
    EXPECT_NEAR(r.rejected_reward, 0.0, 1e-12);
    EXPECT_NEAR(r.margin, 0.1, 1e-12);
    EXPECT_EQ(r.accuracy, 1.0);
    if (kinds[k] == DpoLoss::Sigmoid) {
      r.loss.backward();
      EXPECT_NEAR(pc.grad()[0].item<double>(), -beta * sig(-0.15) / 2, 1e-12);
      EXPECT_NEAR(pr.grad()[1].item<double>(), beta * sig(-0.05) / 2, 1e-12);
    }
  }
  // A pair the policy gets wrong counts against the accuracy.
  EXPECT_EQ(dpo_loss(vec({-3.0, -2.0}), vec({-1.5, -1.0}), rc, rr, beta, DpoLoss::Sigmoid).accuracy, 0.5);
  EXPECT_THROW(parse_dpo_loss("kto"), std::invalid_argument);
  EXPECT_THROW(dpo_loss(vec({1}), vec({1, 2}), vec({1}), vec({1}), beta, DpoLoss::Sigmoid), std::invalid_argument);
}

plan::ModelSpec spec() { return test::tiny_llama(100, 16); }

TEST(Dpo, SequenceLogprobsSumTheTargetsLogSoftmax) {
  Comm solo("solo", 0);
  Transformer m(spec(), solo, false, 3);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor tokens = at::randint(100, {2, 16}, gen, at::kLong);
  at::Tensor targets = at::randint(100, {2, 16}, gen, at::kLong);
  targets.narrow(1, 0, 6).fill_(-1);  // a prompt: not part of the answer's log-prob
  at::NoGradGuard no_grad;
  const at::Tensor lp = sequence_logprobs(m, tokens, targets, false);
  const at::Tensor logits = m.logits(tokens).narrow(2, 0, 100).to(at::kDouble);  // [s, b, V]
  const at::Tensor logp = at::log_softmax(logits, -1);
  for (int64_t b = 0; b < 2; ++b) {
    double want = 0;
    for (int64_t j = 6; j < 16; ++j) want += logp[j][b][targets[b][j].item<int64_t>()].item<double>();
    EXPECT_NEAR(lp[b].item<double>(), want, 1e-4 * std::abs(want)) << b;
  }
}

TEST(Dpo, AdaptersDisabledReferenceEqualsAFrozenCopy) {
  Comm solo("solo", 0);
  Transformer policy(spec(), solo, false, 3), copy(spec(), solo, false, 3);
  LoraOptions o;
  o.targets = {"all"};
  apply_lora(policy, o);
  {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
    for (auto& p : policy.params().params()) {
      if (p.name.find(".lora_b") != std::string::npos) p.tensor.copy_(at::randn(p.tensor.sizes(), gen) * 0.05);
    }
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor tokens = at::randint(100, {4, 16}, gen, at::kLong), targets = at::randint(100, {4, 16}, gen, at::kLong);
  auto run = [&](bool use_copy) {
    for (auto& p : policy.params().params()) p.tensor.mutable_grad() = at::Tensor();
    at::Tensor ref;
    {
      at::NoGradGuard no_grad;
      if (use_copy) {
        ref = sequence_logprobs(copy, tokens, targets, false);
      } else {
        enable_lora(policy, false);
        ref = sequence_logprobs(policy, tokens, targets, false);
        enable_lora(policy, true);
      }
    }
    const at::Tensor pol = sequence_logprobs(policy, tokens, targets, true);
    // Rows 0, 1 chosen; rows 2, 3 rejected.
    const DpoResult r = dpo_loss(pol.narrow(0, 0, 2), pol.narrow(0, 2, 2), ref.narrow(0, 0, 2), ref.narrow(0, 2, 2),
                                 0.1, DpoLoss::Sigmoid);
    r.loss.backward();
    std::vector<at::Tensor> grads;
    for (auto& p : policy.params().params()) {
      if (!p.frozen) grads.push_back(p.tensor.grad().clone());
    }
    return std::make_pair(r.loss.item<double>(), grads);
  };
  const auto [la, ga] = run(true);
  const auto [lb, gb] = run(false);
  EXPECT_EQ(la, lb);
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(at::equal(ga[i], gb[i])) << i;
  EXPECT_NE(la, std::log(2.0));  // the adapters moved the policy away from the reference
}

TEST(Dpo, PreferencePairsTwoBlocksEachChosenFirst) {
  const auto pair = nlohmann::json::parse(R"({"prompt": "Quote Genesis 1:3", "chosen": "Let there be light.",
                                              "rejected": "Jesus wept."})");
  const auto chosen = render_chat(preference_conversation(pair, true));
  const auto rejected = render_chat(preference_conversation(pair, false));
  ASSERT_EQ(chosen.size(), 3u);  // user turn, assistant header, answer + END
  EXPECT_FALSE(chosen[0].train);
  EXPECT_FALSE(chosen[1].train);
  EXPECT_EQ(chosen[2].text, "Let there be light.<|end|>\n");
  EXPECT_TRUE(chosen[2].train);
  EXPECT_EQ(rejected[2].text, "Jesus wept.<|end|>\n");
  EXPECT_EQ(chosen[0].text, rejected[0].text);
  // A list prompt is the conversation so far.
  const auto multi = nlohmann::json::parse(R"({"prompt": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Quote"}], "chosen": "a", "rejected": "b"})");
  EXPECT_EQ(render_chat(preference_conversation(multi, true)).size(), 4u);
  EXPECT_THROW(preference_conversation(nlohmann::json::parse(R"({"prompt": "p", "chosen": "a"})"), true),
               std::invalid_argument);
  EXPECT_THROW(preference_conversation(nlohmann::json::parse(R"({"prompt": 3, "chosen": "a", "rejected": "b"})"), true),
               std::invalid_argument);

  auto seq = [](int64_t line, uint32_t first, uint32_t prompt, uint32_t answer) {
    TokenizedChat c;
    c.line = line;
    for (uint32_t i = 0; i < prompt + answer; ++i) {
      c.ids.push_back(first + i);
      c.mask.push_back(i >= prompt);
    }
    return c;
  };
  // seq 8: pair 1 = [3 + 2 | pad] [3 + 4 | pad], pair 2 = [2 + 6] [2 + 1 | pad]
  const PackedChats p = pack_pairs({seq(1, 10, 3, 2), seq(1, 20, 3, 4), seq(2, 30, 2, 6), seq(2, 40, 2, 1)}, 8, 0, false);
  ASSERT_EQ(p.tokens.size(), 4u * 8 + 1);
  for (uint32_t b = 0; b < 4; ++b) EXPECT_EQ(p.tokens[b * 8], 10 * (b + 1)) << "block " << b << " starts its sequence";
  EXPECT_EQ(p.trained, 2u + 4 + 6 + 1);
  EXPECT_EQ(p.padding, 3u + 1 + 0 + 5);
  try {
    pack_pairs({seq(1, 10, 3, 2), seq(9, 20, 8, 2)}, 8, 0, true);
    ADD_FAILURE() << "a prompt filling seq was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the pair on line 9: its prompt fills --seq 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pack_pairs({seq(1, 10, 3, 2), seq(1, 20, 3, 9)}, 8, 0, false), std::invalid_argument);
  EXPECT_EQ(pack_pairs({seq(1, 10, 3, 2), seq(1, 20, 3, 9)}, 8, 0, true).truncated, 1u);
}

TEST(Dpo, LoaderKeepsPairsTogetherAcrossRanks) {
  test::Dir d;
  // 12 pairs of blocks of 8: window w holds tokens 8w .. 8w+8, token = its index.
  std::vector<uint32_t> tokens(12 * 2 * 8 + 1);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  write_shard((d.path / "p.bin").string(), tokens, {0}, 4);
  const std::string shard = (d.path / "p.bin").string();
  LoaderOptions pairs;
  pairs.group = 2;
  TokenLoader one({shard}, 8, 4, 0, 1, 7, pairs), r0({shard}, 8, 2, 0, 2, 7, pairs), r1({shard}, 8, 2, 1, 2, 7, pairs);
  EXPECT_EQ(one.steps_per_epoch(), 3u);
  std::set<uint64_t> seen;
  for (int step = 0; step < 3; ++step) {
    const Batch b = one.next(), a = r0.next(), c = r1.next();
    ASSERT_EQ(b.tokens.size(0), 8);
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(b.windows[2 * i] % 2, 0u) << "row " << 2 * i << " is a chosen block";
      EXPECT_EQ(b.windows[2 * i + 1], b.windows[2 * i] + 1) << "its rejected block follows";
      EXPECT_EQ(b.tokens[2 * i][0].item<int64_t>(), static_cast<int64_t>(8 * b.windows[2 * i]));
      seen.insert(b.windows[2 * i] / 2);
    }
    // Rank r takes the r-th micro-batch of pairs: together, one process's batch.
    EXPECT_TRUE(at::equal(at::cat({a.tokens, c.tokens}), b.tokens)) << "step " << step;
  }
  EXPECT_EQ(seen.size(), 12u) << "every pair once per epoch";
  // A shard that is not whole pairs is refused.
  tokens.resize(3 * 8 + 1);
  write_shard((d.path / "odd.bin").string(), tokens, {0}, 4);
  EXPECT_THROW(TokenLoader({(d.path / "odd.bin").string()}, 8, 1, 0, 1, 7, pairs), std::invalid_argument);
}

TEST(Dpo, ObjectiveThroughTheStepEqualsTheHandComputation) {
  Comm solo("solo", 0);
  Transformer policy(spec(), solo, false, 3), reference(spec(), solo, false, 4);  // another seed: another model
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  Batch b;
  b.tokens = at::randint(100, {4, 16}, gen, at::kLong);
  b.targets = at::randint(100, {4, 16}, gen, at::kLong);
  b.targets.narrow(1, 0, 5).fill_(-1);
  at::Tensor pol, ref;
  {
    at::NoGradGuard no_grad;
    pol = sequence_logprobs(policy, b.tokens, b.targets, false);
    ref = sequence_logprobs(reference, b.tokens, b.targets, false);
  }
  const double beta = 0.2;
  double loss = 0, chosen = 0, rejected = 0, right = 0;
  for (int64_t i = 0; i < 2; ++i) {  // row 2i chosen, 2i+1 rejected
    const double rc = beta * (pol[2 * i] - ref[2 * i]).item<double>();
    const double rr = beta * (pol[2 * i + 1] - ref[2 * i + 1]).item<double>();
    loss += std::log1p(std::exp(-(rc - rr))) / 2;
    chosen += rc / 2, rejected += rr / 2, right += (rc > rr) / 2.0;
  }
  DpoObjective objective({beta, DpoLoss::Sigmoid}, &reference);
  AdamWOptions ao;
  ao.lr = 1e-3;  // the step reports the loss and metrics of the weights before its update
  AdamW opt(policy.params().params(), ao);
  StepOptions so;
  so.objective = &objective;
  TrainStep step(policy, opt, solo, solo, so);
  // Two micro-batches of one pair each: the mean is over the global batch's pairs.
  Batch first{b.tokens.narrow(0, 0, 2), b.targets.narrow(0, 0, 2), {}, {}};
  Batch second{b.tokens.narrow(0, 2, 2), b.targets.narrow(0, 2, 2), {}, {}};
  const StepResult r = step.run({first, second});
  // fp32: the step's forward runs 2-row micro-batches, the hand's one 4-row
  // batch (other GEMM blocking), so log-prob sums of ~50 differ by ~1e-6 relative.
  const double tol = 1e-6 * beta * pol.abs().max().item<double>();
  EXPECT_NEAR(r.loss, loss, tol);
  EXPECT_EQ(r.tokens, 2);
  ASSERT_EQ(r.metrics.size(), 4u);
  EXPECT_EQ(r.metrics[0].first, "rewards/chosen");
  EXPECT_NEAR(r.metrics[0].second, chosen, tol);
  EXPECT_NEAR(r.metrics[1].second, rejected, tol);
  EXPECT_NEAR(r.metrics[2].second, chosen - rejected, tol);
  EXPECT_NEAR(r.metrics[3].second, right, 1e-12);
  Batch odd{b.tokens.narrow(0, 0, 3), b.targets.narrow(0, 0, 3), {}, {}};
  EXPECT_THROW(step.run({odd}), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
