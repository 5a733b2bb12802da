// AdamW against an independent scalar implementation of the update, the
// learning-rate schedules at known points, and parameter groups.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "meshtrain/optim/adamw.h"

namespace meshtrain {
namespace {

TEST(AdamW, MatchesTheFormulaElementByElement) {
  ParamStore store(1, 0, 1);
  store.create("w.weight", {2, 3}, Init::Normal, 1.0, -1);
  store.create("w.bias", {3}, Init::Normal, 1.0, -1);
  AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  o.schedule = LrSchedule::Constant;
  o.clip_norm = 0;
  AdamW opt(store.params(), o);
  // Reference in double, element by element.
  std::vector<std::vector<double>> p, m, v;
  for (auto& q : store.params()) {
    auto t = q.tensor.detach().to(at::kDouble).contiguous();
    p.emplace_back(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    m.emplace_back(t.numel(), 0.0);
    v.emplace_back(t.numel(), 0.0);
  }
  for (int step = 1; step <= 3; ++step) {
    for (size_t k = 0; k < store.params().size(); ++k) {
      auto& q = store.params()[k];
      q.tensor.mutable_grad() = at::full(q.tensor.sizes(), 0.1 * step * (k + 1), at::kFloat) + q.tensor.detach() * 0.5;
      auto g = q.tensor.grad().to(at::kDouble).contiguous();
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double gi = g.data_ptr<double>()[i];
        m[k][i] = o.beta1 * m[k][i] + (1 - o.beta1) * gi;
        v[k][i] = o.beta2 * v[k][i] + (1 - o.beta2) * gi * gi;
        const double mhat = m[k][i] / (1 - std::pow(o.beta1, step)), vhat = v[k][i] / (1 - std::pow(o.beta2, step));
        if (k == 0) p[k][i] *= 1 - o.lr * o.weight_decay;  // the bias gets no decay
        p[k][i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
      }
    }
    opt.step(nullptr);
    for (size_t k = 0; k < store.params().size(); ++k) {
      auto t = store.params()[k].tensor.detach().to(at::kDouble).contiguous();
      for (size_t i = 0; i < p[k].size(); ++i) ASSERT_NEAR(t.data_ptr<double>()[i], p[k][i], 1e-6) << step;
    }
  }
}

TEST(AdamW, ClipsToTheGlobalNorm) {
  ParamStore store(1, 0, 1);
  store.create("a.weight", {2, 2}, Init::Zeros, 0, -1);
  store.params()[0].tensor.mutable_grad() = at::full({2, 2}, 3.0, at::kFloat);  // norm 6
  AdamWOptions o;
  o.clip_norm = 1.0;
  EXPECT_DOUBLE_EQ(global_grad_norm(store.params(), nullptr), 6.0);
  AdamW opt(store.params(), o);
  EXPECT_DOUBLE_EQ(opt.step(nullptr), 6.0);
  // After clipping the gradient is 0.5 per element: m = 0.05 after one step.
  EXPECT_NEAR(opt.exp_avg()[0][0][0].item<double>(), (1 - o.beta1) * 0.5, 1e-6);
}

TEST(AdamW, Schedules) {
  AdamWOptions o;
  o.lr = 1.0;
  o.warmup_steps = 10;
  o.total_steps = 110;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1.0);
  EXPECT_NEAR(learning_rate(o, 60), 0.55, 1e-12);  // cosine midpoint: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(o, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 500), 0.1, 1e-12);
  o.schedule = LrSchedule::Linear;
  EXPECT_NEAR(learning_rate(o, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(o, 35), 1.0 - 0.9 * 0.25, 1e-12);
  o.schedule = LrSchedule::Constant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 100), 1.0);
  EXPECT_THROW(parse_lr_schedule("step"), std::invalid_argument);
}

TEST(AdamW, ParameterGroups) {
  AdamWOptions o;
  Param norm{"layers.0.norm1.weight", {}, {64}, -1, false};
  Param bias{"layers.0.attn.q.bias", {}, {64}, 0, false};
  Param w{"layers.0.attn.q.weight", {}, {64, 64}, 0, false};
  Param emb{"embed.weight", {}, {100, 64}, 0, false};
  EXPECT_FALSE(decays(norm, o));
  EXPECT_FALSE(decays(bias, o));
  EXPECT_TRUE(decays(w, o));
  EXPECT_TRUE(decays(emb, o));
  o.decay_embeddings = false;
  EXPECT_FALSE(decays(emb, o));
}

}  // namespace
}  // namespace meshtrain
