// DPO (train/dpo.h): the loss, rewards, margin and accuracy equal a hand
// computation on a two-pair batch for each variant, and the gradient is the
// paper's (−β σ(−h) / n on the chosen log-prob); sequence log-probs are sums
// of log-softmax entries; with LoRA, the policy with adapters disabled as the
// reference gives exactly what an explicit frozen copy gives.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/train/dpo.h"

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

plan::ModelSpec spec() {
  plan::ModelSpec m = plan::preset("llama-tiny");
  m.layers = 2, m.vocab = 100, m.seq = 16, m.dropout = 0;
  return m;
}

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

}  // namespace
}  // namespace meshtrain
