// PPO's pieces (rl/ppo.h, rl/critic.h) against hand computations: KL-shaped
// rewards (k1, k3, the score at the last policy token), GAE on a 3-step
// episode (and the same advantages when an environment's reply sits between
// the actions), whitening, the clipped value loss (and its zero gradient where
// the clip is active), the clipped surrogate with per-token advantages
// (w = 1: −mean A); the value head: causal, trainable, the unused LM head
// frozen.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "meshtrain/comm/comm.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/critic.h"
#include "meshtrain/rl/grpo.h"
#include "meshtrain/rl/ppo.h"
#include "meshtrain/rl/reward_model.h"
#include "tests/tiny_model.h"

namespace meshtrain {
namespace {

at::Tensor row(std::vector<double> v) { return at::tensor(v, at::kDouble).unsqueeze(0); }
double at2(const at::Tensor& t, int64_t i, int64_t j) { return t[i][j].item<double>(); }

TEST(Ppo, KlShapedRewardsByHand) {
  const at::Tensor old = at::cat({row({-1, -2, -0.5, 0}), row({-1, -1, -1, -1})});
  const at::Tensor ref = at::cat({row({-1.5, -2, -1, -3}), row({0, 0, 0, 0})});
  const at::Tensor mask = at::cat({row({1, 1, 1, 0}), row({0, 0, 0, 0})});
  const at::Tensor scores = at::tensor({2.0, 5.0}, at::kDouble);
  const at::Tensor k1 = kl_shaped_rewards(old, ref, mask, scores, 0.1, KlEstimator::K1);
  // k1 = lp_old − lp_ref = [0.5, 0, 0.5]; the score at the last policy token (index 2).
  EXPECT_NEAR(at2(k1, 0, 0), -0.05, 1e-12);
  EXPECT_NEAR(at2(k1, 0, 1), 0.0, 1e-12);
  EXPECT_NEAR(at2(k1, 0, 2), -0.05 + 2, 1e-12);
  EXPECT_EQ(at2(k1, 0, 3), 0) << "outside the mask";
  EXPECT_EQ(k1[1].abs().sum().item<double>(), 0) << "a row without policy tokens gets no score";
  const at::Tensor k3 = kl_shaped_rewards(old, ref, mask, scores, 0.1, KlEstimator::K3);
  const double k3_0 = std::exp(-0.5) + 0.5 - 1;  // e^d − d − 1, d = lp_ref − lp_old
  EXPECT_NEAR(at2(k3, 0, 0), -0.1 * k3_0, 1e-12);
  EXPECT_NEAR(at2(k3, 0, 2), -0.1 * k3_0 + 2, 1e-12);
  EXPECT_THROW(parse_kl_estimator("k2"), std::invalid_argument);
}

TEST(Ppo, GaeByHandOnAThreeStepEpisode) {
  // r = [0, 0, 1], V = [0.5, 0.2, 0.8], γ = 0.9, λ = 0.8:
  //   δ2 = 1 − 0.8 = 0.2                 Â2 = 0.2
  //   δ1 = 0.9·0.8 − 0.2 = 0.52          Â1 = 0.52 + 0.72·0.2 = 0.664
  //   δ0 = 0.9·0.2 − 0.5 = −0.32         Â0 = −0.32 + 0.72·0.664 = 0.15808
  const Gae g = gae(row({0, 0, 1}), row({0.5, 0.2, 0.8}), row({1, 1, 1}), 0.9, 0.8);
  const double want[3] = {0.15808, 0.664, 0.2}, v[3] = {0.5, 0.2, 0.8};
  for (int t = 0; t < 3; ++t) {
    EXPECT_NEAR(at2(g.advantages, 0, t), want[t], 1e-12) << t;
    EXPECT_NEAR(at2(g.returns, 0, t), want[t] + v[t], 1e-12) << t;
  }
  // The same actions behind a prompt position and with an environment's reply
  // between them (mask 0): the same advantages at the actions, 0 elsewhere.
  const Gae e = gae(row({9, 0, 9, 0, 1}), row({7, 0.5, 7, 0.2, 0.8}), row({0, 1, 0, 1, 1}), 0.9, 0.8);
  EXPECT_NEAR(at2(e.advantages, 0, 1), want[0], 1e-12);
  EXPECT_NEAR(at2(e.advantages, 0, 3), want[1], 1e-12);
  EXPECT_NEAR(at2(e.advantages, 0, 4), want[2], 1e-12);
  EXPECT_EQ(at2(e.advantages, 0, 0), 0);
  EXPECT_EQ(at2(e.advantages, 0, 2), 0);
  // γ = λ = 1 with values 0: every action's advantage is the return to the end.
  const Gae mc = gae(row({1, 2, 3}), row({0, 0, 0}), row({1, 1, 1}), 1, 1);
  EXPECT_NEAR(at2(mc.advantages, 0, 0), 6, 1e-12);
  EXPECT_NEAR(at2(mc.advantages, 0, 2), 3, 1e-12);
}

TEST(Ppo, WhiteningUsesTheGivenMoments) {
  const at::Tensor x = row({1, 2, 3, 100}), m = row({1, 1, 1, 0});
  const at::Tensor w = masked_whiten(x, m, masked_moments(x, m));  // mean 2, unbiased var 1
  EXPECT_NEAR(at2(w, 0, 0), -1 / std::sqrt(1 + 1e-8), 1e-12);
  EXPECT_NEAR(at2(w, 0, 1), 0, 1e-12);
  EXPECT_NEAR(at2(w, 0, 2), 1 / std::sqrt(1 + 1e-8), 1e-12);
  EXPECT_EQ(at2(w, 0, 3), 0);
  // Two ranks' halves summed = the whole batch's moments.
  const at::Tensor a = row({1, 2, 0, 0}), b = row({0, 0, 3, 0});
  const at::Tensor ma = row({1, 1, 0, 0}), mb = row({0, 0, 1, 0});
  EXPECT_TRUE(at::allclose(masked_moments(a, ma) + masked_moments(b, mb), masked_moments(x, m)));
  EXPECT_THROW(masked_whiten(x, m, masked_moments(row({1, 0, 0, 0}), row({1, 0, 0, 0}))), std::invalid_argument);
}

TEST(Ppo, ClippedValueLossByHand) {
  // Token 0 moved 0.3 from its rollout value (beyond ε_v = 0.2): the clipped
  // term (0.9 − 2)² = 1.21 beats (1 − 2)² = 1 and its gradient is 0; token 1
  // moved 0.05: plain, gradient V − R = 0.5.
  const at::Tensor v = row({1.0, 0.5}).requires_grad_(true);
  const ValueTerms t = value_loss(v, row({0.7, 0.45}), row({2.0, 0.0}), row({1, 1}), 0.2);
  EXPECT_NEAR(t.loss.item<double>(), 0.5 * (1.21 + 0.25), 1e-12);
  EXPECT_NEAR(t.clipped, 0.5, 1e-12);
  t.loss.backward();
  EXPECT_NEAR(at2(v.grad(), 0, 0), 0, 1e-12);
  EXPECT_NEAR(at2(v.grad(), 0, 1), 0.5, 1e-12);
  // Inside the clip range the loss is plain ½ (V − R)².
  const ValueTerms in = value_loss(row({1.0}), row({0.9}), row({2.0}), row({1}), 0.2);
  EXPECT_NEAR(in.loss.item<double>(), 0.5, 1e-12);
  EXPECT_EQ(in.clipped, 0);
}

TEST(Ppo, PerTokenAdvantagesInTheClippedSurrogate) {
  // w ≡ 1: the loss is −mean(Â) over the policy tokens.
  const at::Tensor lp = at::cat({row({-1, -2, -3}), row({-1, -1, -1})}).requires_grad_(true);
  const at::Tensor adv = at::cat({row({1, -2, 7}), row({0.5, 0.5, 0})});
  const at::Tensor mask = at::cat({row({1, 1, 0}), row({1, 1, 1})});
  GrpoOptions o;
  const GrpoTerms t = grpo_loss(lp, lp.detach(), {}, adv, mask, o, mask.sum().item<double>());
  EXPECT_NEAR(t.loss.item<double>(), -(1 - 2 + 0.5 + 0.5 + 0) / 5.0, 1e-12);
  t.loss.backward();
  EXPECT_NEAR(at2(lp.grad(), 0, 1), 2 / 5.0, 1e-12) << "−Â w / tokens";
  EXPECT_EQ(at2(lp.grad(), 0, 2), 0) << "masked";
}

TEST(Ppo, ValueHeadIsCausalTrainableAndFreezesTheLmHead) {
  Comm solo("solo", 0);
  plan::ModelSpec spec = test::tiny_llama(32, 16);
  spec.tied = false;
  Transformer m(spec, solo, false, 5);
  add_value_head(m);
  EXPECT_TRUE(has_value_head(m));
  EXPECT_TRUE(m.params().find("head.weight").frozen);
  EXPECT_FALSE(m.params().find("value_head.weight").frozen);
  const at::Tensor tokens = at::tensor({3, 1, 4, 1, 5, 9, 2, 6}, at::kLong).view({2, 4});
  const at::Tensor v = values(m, tokens);
  EXPECT_EQ(v.sizes(), (std::vector<int64_t>{2, 4}));
  // Position j's value sees tokens ..j only.
  EXPECT_TRUE(at::allclose(values(m, tokens.narrow(1, 0, 2)), v.narrow(1, 0, 2), 1e-5, 1e-6));
  values(m, tokens, true).sum().backward();
  EXPECT_GT(m.params().find("value_head.weight").tensor.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(m.params().find("layers.0.attn.q.weight").tensor.grad().abs().sum().item<double>(), 0);
  EXPECT_FALSE(m.params().find("head.weight").tensor.grad().defined());
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// The reward model (rl/reward_model.h): a sequence's score is its value at
// the position predicting its last trained token; the Bradley–Terry loss by
// hand; a checkpoint without a value head is refused by name.
TEST(RewardModel, ScoresAtTheLastTrainedPositionAndBradleyTerryByHand) {
  Comm solo("solo", 0);
  Transformer m(test::tiny_llama(32, 16), solo, false, 11);
  add_value_head(m);
  const at::Tensor tokens = at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 2, 7, 7, 0, 0}, at::kLong).view({2, 8});
  at::Tensor targets = at::full({2, 8}, -1, at::kLong);
  targets[0].narrow(0, 2, 3).fill_(1);  // row 0 trained at 2..4: scored at 4
  targets[1].narrow(0, 1, 5).fill_(1);  // row 1 trained at 1..5: scored at 5
  const at::Tensor v = values(m, tokens);
  const at::Tensor s = sequence_scores(m, tokens, targets, false);
  EXPECT_NEAR(s[0].item<double>(), v[0][4].item<double>(), 1e-6);
  EXPECT_NEAR(s[1].item<double>(), v[1][5].item<double>(), 1e-6);
  EXPECT_TRUE(at::allclose(score_rows(m, tokens, at::tensor({5, 6}, at::kLong)), s, 1e-6, 1e-6))
      << "an RL row's last token at 5 (6) is predicted at 4 (5)";
  Batch b;
  b.tokens = tokens, b.targets = targets;
  RewardModelObjective o;
  std::vector<double> metrics(4, 0.0);
  EXPECT_EQ(o.units(b), 1.0);
  const double margin = s[0].item<double>() - s[1].item<double>();
  EXPECT_NEAR(o.loss(m, b, false, metrics).item<double>(), std::log1p(std::exp(-margin)), 1e-6);
  EXPECT_NEAR(metrics[2], margin, 1e-6);
  EXPECT_EQ(metrics[3], margin > 0 ? 1.0 : 0.0);
  at::Tensor none = at::full({2, 8}, -1, at::kLong);
  EXPECT_THROW(sequence_scores(m, tokens, none, false), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
