// nn::linear's fused weight-gradient accumulation (nn/linear.h) against at::linear's
// own autograd node: the same gradients, .grad written in place only where
// AccumulateGrad would have added into it, and AccumulateGrad's hooks still firing
// once .grad is final.
//
// Tolerance: |fused - native| <= 1e-6 max|native| per tensor. The GEMM adds into
// .grad as it goes (beta = 1) where the native node adds a finished dW: the same
// products, summed in another order (fp32 rounding, a few ulp).
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>

#include "meshtrain/nn/linear.h"
#include "src/parallel/data/grad_ready.h"
#include "tests/accumulator_watch.h"

namespace meshtrain::test {
namespace {

constexpr double kRel = 1e-6;  // see above

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LE((got - want).abs().max().item<double>(), kRel * want.abs().max().item<double>()) << what;
}

struct Case {
  at::Tensor x, w, b;  // x [2, 5, 7] (leading dimensions folded), W [3, 7], b [3]
  explicit Case(bool bias = true) {
    at::manual_seed(3);
    x = at::randn({2, 5, 7}).requires_grad_(true);
    w = at::randn({3, 7}).requires_grad_(true);
    if (bias) b = at::randn({3}).requires_grad_(true);
  }
  // Two micro-batches' backward into the same .grad, through f (nn::linear or at::linear).
  template <class F>
  void two_backwards(F f) {
    for (double s : {1.0, -0.5}) (f(x, w, b) * s).pow(2).sum().backward();
  }
};

TEST(Linear, FusedAccumulationEqualsTheNativeNode) {
  for (bool bias : {true, false}) {
    Case fused(bias), native(bias);
    fused.two_backwards([](auto& x, auto& w, auto& b) { return nn::linear(x, w, b); });
    native.two_backwards([](auto& x, auto& w, auto& b) { return at::linear(x, w, b); });
    expect_close(fused.w.grad(), native.w.grad(), "dW");
    if (bias) expect_close(fused.b.grad(), native.b.grad(), "db");
    expect_close(fused.x.grad(), native.x.grad(), "dx");
  }
}

// A pre-existing .grad (DDP's bucket view) is written in place: its storage stays the
// view's, and the accumulator's gradient-ready hook sees the final value.
TEST(Linear, AddsIntoTheExistingGradInPlaceBeforeTheReadyHook) {
  Case c, ref;
  const at::Tensor bucket = at::full({3 * 7 + 4}, 0.25);
  c.w.mutable_grad() = bucket.narrow(0, 2, 21).view({3, 7});
  ref.w.mutable_grad() = at::full({3, 7}, 0.25);
  at::Tensor seen;
  auto keep = on_grad_ready(c.w, "w", [&] { seen = c.w.grad().clone(); });
  const auto [acc, handed] = watch_accumulator(c.w);
  nn::linear(c.x, c.w, c.b).pow(2).sum().backward();
  at::linear(ref.x, ref.w, ref.b).pow(2).sum().backward();
  EXPECT_FALSE(*handed) << "the GEMM did not add into .grad: AccumulateGrad got a dW to add";
  EXPECT_EQ(c.w.grad().data_ptr(), bucket.narrow(0, 2, 21).data_ptr());
  expect_close(c.w.grad(), ref.w.grad(), "dW in the bucket");
  expect_close(seen, ref.w.grad(), "dW when the ready hook ran");
  EXPECT_EQ(bucket[0].item<double>(), 0.25);  // the bucket's other slots untouched
  EXPECT_EQ(bucket[23].item<double>(), 0.25);
}

// autograd::grad runs no AccumulateGrad: .grad must not change and the gradient is returned.
TEST(Linear, AutogradGradLeavesGradAlone) {
  Case c, ref;
  c.w.mutable_grad() = at::ones({3, 7});
  const at::Tensor before = c.w.grad().clone();
  const auto g = torch::autograd::grad({nn::linear(c.x, c.w, c.b).pow(2).sum()}, {c.w});
  const auto want = torch::autograd::grad({at::linear(ref.x, ref.w, ref.b).pow(2).sum()}, {ref.w});
  EXPECT_TRUE(at::equal(c.w.grad(), before));
  expect_close(g[0], want[0], "returned dW");
}

// A hook on W's gradient sees every contribution: the fusion steps aside.
TEST(Linear, HooksOnTheWeightsGradientSeeTheGradient) {
  Case c, ref;
  c.w.mutable_grad() = at::zeros({3, 7});
  int calls = 0;
  c.w.register_hook([&](const at::Tensor& g) {
    ++calls;
    return g * 2;
  });
  const auto [acc, handed] = watch_accumulator(c.w);
  nn::linear(c.x, c.w, c.b).pow(2).sum().backward();
  at::linear(ref.x, ref.w, ref.b).pow(2).sum().backward();
  EXPECT_TRUE(*handed);
  EXPECT_EQ(calls, 1);
  expect_close(c.w.grad(), ref.w.grad() * 2, "hooked dW");
}

// A .grad of another dtype or a non-leaf weight (ZeRO-3's gathered copy): dW is returned.
TEST(Linear, OtherGradsAndGatheredWeightsGetTheirGradientReturned) {
  Case c, ref;
  c.w.mutable_grad() = at::zeros({3, 7}, at::kDouble);
  nn::linear(c.x, c.w, c.b).pow(2).sum().backward();
  at::linear(ref.x, ref.w, ref.b).pow(2).sum().backward();
  expect_close(c.w.grad().to(at::kFloat), ref.w.grad(), "dW into a double .grad");

  Case g;
  const at::Tensor gathered = g.w * 1.0;  // a non-leaf standing for the gathered weight
  gathered.retain_grad();
  nn::linear(g.x, gathered, g.b).pow(2).sum().backward();
  expect_close(gathered.grad(), ref.w.grad(), "the gathered weight's dW");
  expect_close(g.w.grad(), ref.w.grad(), "the shard's leaf");
}

}  // namespace
}  // namespace meshtrain::test
