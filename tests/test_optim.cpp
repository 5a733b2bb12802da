// AdamW against an independent scalar implementation of the update, the
// learning-rate schedules at known points, and parameter groups.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "meshtrain/optim/adamw.h"
#include "src/optim/fused_adamw.h"
#include "src/optim/sum_squares.h"

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

// The fused update (one pass per tensor, src/optim/fused_adamw.h) equals the
// update as separate ATen ops over 5 steps, with clipping active, a decayed
// and an undecayed group, and tensors large enough to be split across
// threads: weights within 1e-5 of the distance they travelled, moments within
// 1e-6 relative (the two round fused multiply-adds differently).
TEST(AdamW, FusedEqualsTheUnfusedUpdate) {
  ParamStore a(4, 0, 1), b(4, 0, 1);
  for (ParamStore* s : {&a, &b}) {
    s->create("w.weight", {300, 200}, Init::Normal, 1.0, -1);
    s->create("w.bias", {200}, Init::Normal, 1.0, -1);
    s->create("v.weight", {70000}, Init::Normal, 1.0, -1);
  }
  b.params()[2].decay = 0;  // a flat of ZeRO's without decay
  a.params()[2].decay = 0;
  AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  o.clip_norm = 0.5;  // the gradients' norm is far above: clipping acts every step
  o.fused = true;
  AdamW fused(a.params(), o);
  o.fused = false;
  AdamW plain(b.params(), o);
  std::vector<at::Tensor> start;
  for (const auto& p : a.params()) start.push_back(p.tensor.detach().clone());
  for (int step = 1; step <= 5; ++step) {
    for (size_t k = 0; k < a.params().size(); ++k) {
      const at::Tensor g = at::sin(a.params()[k].tensor.detach() * step) + 0.1 * step;
      a.params()[k].tensor.mutable_grad() = g.clone();
      b.params()[k].tensor.mutable_grad() = g.clone();
    }
    EXPECT_NEAR(fused.step(nullptr), plain.step(nullptr), 1e-9);
  }
  for (size_t k = 0; k < a.params().size(); ++k) {
    const at::Tensor wa = a.params()[k].tensor.detach(), wb = b.params()[k].tensor.detach();
    EXPECT_LE((wa - wb).norm().item<double>(), 1e-5 * (wb - start[k]).norm().item<double>()) << k;
    EXPECT_TRUE(at::allclose(fused.exp_avg()[k], plain.exp_avg()[k], 1e-6, 1e-9)) << k;
    EXPECT_TRUE(at::allclose(fused.exp_avg_sq()[k], plain.exp_avg_sq()[k], 1e-6, 1e-12)) << k;
    EXPECT_GT((wb - start[k]).norm().item<double>(), 0) << k;
  }
}

// The kernel takes the fp32 contiguous tensors AdamW holds (so the test above
// runs it) and refuses what it cannot do in place, leaving it untouched.
TEST(AdamW, TheFusedKernelTakesContiguousFp32AndRefusesTheRest) {
  const at::Tensor p = at::ones({40000}), g = at::full({40000}, 2.0f), m = at::zeros({40000}), v = at::zeros({40000});
  AdamWCoefficients c;
  c.step = 0.1f;
  ASSERT_TRUE(fused_adamw_update(p, g, m, v, c));
  // m = 0.1 x 2, v = 0.05 x 4: p = 1 - 0.1 x 0.2 / (sqrt(0.2) + eps)
  EXPECT_NEAR(p[123].item<double>(), 1 - 0.1 * 0.2 / (std::sqrt(0.2) + 1e-8), 1e-6);
  EXPECT_NEAR(m[39999].item<double>(), 0.2, 1e-7);
  const at::Tensor strided = at::ones({40000, 2}).select(1, 0);
  EXPECT_FALSE(fused_adamw_update(strided, g, m, v, c));
  EXPECT_FALSE(fused_adamw_update(p, g.to(at::kBFloat16), m, v, c));
  EXPECT_EQ(strided.sum().item<double>(), 40000);
}

// The gradient norm's sum of squares: one pass in double over fp32 blocks equals the ATen expression
// (double sums in another order: within 1e-12 relative), for sizes around the block and lane widths, any
// thread count; other dtypes and strided tensors take the ATen expression.
TEST(AdamW, SumOfSquaresEqualsTheDoubleExpression) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{65535}, int64_t{65536}, int64_t{200003}}) {
    const at::Tensor t = at::randn({n}) * 3;
    const double want = t.to(at::kDouble).pow(2).sum().item<double>();
    EXPECT_NEAR(sum_of_squares(t), want, 1e-12 * want) << n;
  }
  const at::Tensor big = at::randn({300001});
  const double once = sum_of_squares(big);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  EXPECT_EQ(sum_of_squares(big), once) << "the result depends on the thread count";
  at::set_num_threads(threads);
  const at::Tensor strided = at::randn({1000, 2}).select(1, 1);
  EXPECT_NEAR(sum_of_squares(strided), strided.to(at::kDouble).pow(2).sum().item<double>(), 1e-9);
  const at::Tensor half = at::randn({999}).to(at::kBFloat16);
  EXPECT_NEAR(sum_of_squares(half), half.to(at::kDouble).pow(2).sum().item<double>(), 1e-9);
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
