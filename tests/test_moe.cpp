// Mixture-of-experts routing (moe/router.h) against hand computations and an
// independent loop-by-loop reference of the same rule.
#include <cmath>
#include <random>
#include <vector>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include "meshtrain/moe/experts.h"
#include "meshtrain/moe/router.h"

namespace meshtrain {
namespace {

// Logits whose softmax is `p` row by row, shifted by `shift[t]` (softmax does not
// see it; logsumexp is the shift: the z-loss does).
at::Tensor logits_of(const std::vector<std::vector<double>>& p, const std::vector<double>& shift) {
  at::Tensor l = at::empty({static_cast<int64_t>(p.size()), static_cast<int64_t>(p[0].size())}, at::kDouble);
  for (size_t t = 0; t < p.size(); ++t) {
    for (size_t e = 0; e < p[t].size(); ++e) l[t][e] = std::log(p[t][e]) + shift[t];
  }
  return l.to(at::kFloat);
}

// Four tokens, three experts, top 2, capacity factor 0.75: C = ceil(0.75 x 4 x 2 / 3) = 2.
// First choices in token order: t0->e0, t1->e0, t2->e0 (third: dropped), t3->e1;
// then second choices: t0->e1, t1->e2, t2->e1 (third: dropped), t3->e2.
TEST(MoeRouter, CapacityDropsInPriorityOrderAndTheLossesMatchAHandComputation) {
  const at::Tensor logits = logits_of({{0.5, 0.3, 0.2}, {0.6, 0.1, 0.3}, {0.7, 0.2, 0.1}, {0.2, 0.5, 0.3}},
                                      {1, -2, 0.5, 3});
  const Routing r = route(logits, RouterOptions{3, 2, RouterKind::Softmax, 0.75});
  EXPECT_EQ(r.capacity, 2);
  EXPECT_TRUE(at::equal(r.expert, at::tensor({0, 1, 0, 2, 0, 1, 1, 2}, at::kLong).view({4, 2})));
  EXPECT_TRUE(at::equal(r.kept, at::tensor({1, 1, 1, 1, 0, 0, 1, 1}, at::kLong).view({4, 2}).to(at::kBool)));
  EXPECT_EQ(r.dropped, 2);
  EXPECT_TRUE(at::equal(r.per_expert, at::tensor({2, 2, 2}, at::kLong)));
  const at::Tensor want_gate =
      at::tensor({0.5 / 0.8, 0.3 / 0.8, 0.6 / 0.9, 0.3 / 0.9, 0.0, 0.0, 0.5 / 0.8, 0.3 / 0.8}, at::kFloat).view({4, 2});
  EXPECT_TRUE(at::allclose(r.gate, want_gate, 1e-6, 1e-6)) << r.gate;
  // f (before dropping) = (3, 3, 2) / 8; P = (0.5, 0.275, 0.225): aux = 3 x sum f P.
  EXPECT_NEAR(r.aux_loss.item<double>(), 3 * (3.0 / 8 * 0.5 + 3.0 / 8 * 0.275 + 2.0 / 8 * 0.225), 1e-6);
  EXPECT_NEAR(r.z_loss.item<double>(), (1 + 4 + 0.25 + 9) / 4.0, 1e-5);
  // Dropless: nothing dropped, every gate kept.
  const Routing all = route(logits, RouterOptions{3, 2, RouterKind::Softmax, 0});
  EXPECT_EQ(all.dropped, 0);
  EXPECT_TRUE(at::equal(all.per_expert, at::tensor({3, 3, 2}, at::kLong)));
}

// The same rule written out loop by loop, on random logits: experts, kept
// assignments and gates agree (softmax and sigmoid, several capacities).
TEST(MoeRouter, EqualsALoopByLoopReference) {
  std::mt19937 g(3);
  std::normal_distribution<double> n01;
  const int64_t T = 37, E = 6, k = 2;
  for (RouterKind kind : {RouterKind::Softmax, RouterKind::Sigmoid}) {
    for (double c : {0.0, 0.5, 1.0, 1.25}) {
      std::vector<std::vector<double>> x(T, std::vector<double>(E));
      at::Tensor logits = at::empty({T, E}, at::kFloat);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) logits[t][e] = x[t][e] = 2 * n01(g);
      }
      const Routing r = route(logits, RouterOptions{E, k, kind, c});
      // Reference: scores, the top 2 by hand, gates normalised over them, capacity by priority.
      const int64_t cap = c > 0 ? static_cast<int64_t>(std::ceil(c * T * k / E)) : T * k;
      std::vector<int64_t> load(E, 0);
      std::vector<std::vector<int64_t>> best(T);
      std::vector<std::vector<double>> score(T, std::vector<double>(E));
      for (int64_t t = 0; t < T; ++t) {
        double z = 0;
        for (int64_t e = 0; e < E; ++e) z += std::exp(x[t][e]);
        for (int64_t e = 0; e < E; ++e) {
          score[t][e] = kind == RouterKind::Softmax ? std::exp(x[t][e]) / z : 1 / (1 + std::exp(-x[t][e]));
        }
        int64_t a = 0;
        for (int64_t e = 1; e < E; ++e) a = score[t][e] > score[t][a] ? e : a;
        int64_t b = a == 0 ? 1 : 0;
        for (int64_t e = 0; e < E; ++e) b = e != a && score[t][e] > score[t][b] ? e : b;
        best[t] = {a, b};
      }
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t e = best[t][j];
          const bool kept = load[e]++ < cap;
          SCOPED_TRACE(testing::Message() << "kind " << static_cast<int>(kind) << " c " << c << " token " << t);
          ASSERT_EQ(r.expert[t][j].item<int64_t>(), e);
          EXPECT_EQ(r.kept[t][j].item<bool>(), kept);
          const double sum = score[t][best[t][0]] + score[t][best[t][1]];
          EXPECT_NEAR(r.gate[t][j].item<double>(), kept ? score[t][e] / sum : 0.0, 1e-5);
        }
      }
    }
  }
}

// Bad options are one clear error; the losses carry a gradient to the logits.
TEST(MoeRouter, BadOptionsAndGradients) {
  const at::Tensor l = at::randn({5, 4});
  EXPECT_THROW(route(l, RouterOptions{4, 5, RouterKind::Softmax, 0}), std::invalid_argument);
  EXPECT_THROW(route(l, RouterOptions{4, 1, RouterKind::Sigmoid, 0}), std::invalid_argument);
  EXPECT_THROW(route(l, RouterOptions{4, 2, RouterKind::Softmax, -1}), std::invalid_argument);
  EXPECT_THROW(route(l, RouterOptions{3, 2, RouterKind::Softmax, 0}), std::invalid_argument);
  EXPECT_THROW(parse_router("topk"), std::invalid_argument);
  at::Tensor x = at::randn({5, 4}).requires_grad_(true);
  const Routing r = route(x, RouterOptions{4, 1, RouterKind::Softmax, 0});
  (r.aux_loss + r.z_loss + r.gate.sum()).backward();
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// The grouped experts (one GEMM per expert) equal a loop over tokens and their
// choices, in value and in every gradient (input, weights, router logits),
// for GELU and SwiGLU experts, dropless and with tokens dropped.
TEST(MoeExperts, GroupedEqualsALoopOverTokens) {
  at::manual_seed(5);
  const int64_t T = 23, h = 8, f = 12, E = 5, k = 2;
  for (bool swiglu : {false, true}) {
    for (double c : {0.0, 0.8}) {
      SCOPED_TRACE(testing::Message() << "swiglu " << swiglu << " capacity " << c);
      auto leaf = [](at::Tensor t) { return t.to(at::kDouble).requires_grad_(true); };
      at::Tensor x = leaf(at::randn({T, h})), logits = leaf(at::randn({T, E}));
      ExpertWeights w{leaf(at::randn({E, f, h}) * 0.3), swiglu ? leaf(at::randn({E, f, h}) * 0.3) : at::Tensor(),
                      leaf(at::randn({E, h, f}) * 0.3)};
      std::vector<at::Tensor> leaves{x, logits, w.w1, w.w2};
      if (swiglu) leaves.push_back(w.w3);
      auto grads = [&](const at::Tensor& y) {
        for (auto& t : leaves) t.mutable_grad() = at::Tensor();
        (y * at::linspace(-1, 1, y.numel(), at::kDouble).view_as(y)).sum().backward({}, true);  // the gates are shared
        std::vector<at::Tensor> g;
        for (auto& t : leaves) g.push_back(t.grad().clone());
        return g;
      };
      const Routing r = route(logits.to(at::kFloat), RouterOptions{E, k, RouterKind::Softmax, c});
      // route() computes in fp32; the gates carry the logits' gradient through a double copy.
      Routing rd = r;
      rd.gate = route(logits, RouterOptions{E, k, RouterKind::Softmax, c}).gate.to(at::kDouble);
      const at::Tensor grouped = run_experts(x, rd, w);
      const auto g1 = grads(grouped);
      std::vector<at::Tensor> rows;
      for (int64_t t = 0; t < T; ++t) {
        at::Tensor yt = at::zeros({h}, at::kDouble);
        for (int64_t j = 0; j < k; ++j) {
          if (!rd.kept[t][j].item<bool>()) continue;
          yt = yt + rd.gate[t][j] * expert_ffn(x[t].unsqueeze(0), w, rd.expert[t][j].item<int64_t>())[0];
        }
        rows.push_back(yt);
      }
      const at::Tensor looped = at::stack(rows);
      const auto g2 = grads(looped);
      EXPECT_TRUE(at::allclose(grouped, looped, 1e-6, 1e-9));
      for (size_t i = 0; i < g1.size(); ++i) EXPECT_TRUE(at::allclose(g1[i], g2[i], 1e-6, 1e-9)) << "leaf " << i;
      if (c > 0) EXPECT_GT(r.dropped, 0);
    }
  }
}

}  // namespace
}  // namespace meshtrain
