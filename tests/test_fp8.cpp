// FP8 linears (nn/fp8.h) on CPU, where at::_scaled_mm runs the recipe in
// emulation: the scales, saturation, the amax history of delayed scaling, and
// the forward and backward products against a float64 reference that applies
// the same quantisation (e4m3 input and weight, e5m2 output gradient).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <optional>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/fp8.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/fp8_training.h"
#include "meshtrain/train/precision.h"
#include "meshtrain/train/step.h"
#include "tests/train_cli.h"

namespace meshtrain {
namespace {

using nn::Fp8Format;
using nn::Fp8Linear;
using nn::Fp8Recipe;
using nn::Fp8Scaling;

// What the GEMM should see: q / scale in float64, with the scale of the formula in nn/fp8.h.
at::Tensor dequantised(const at::Tensor& t, Fp8Format f, double amax) {
  const at::Tensor scale = nn::fp8_scale(at::scalar_tensor(amax, at::kFloat), f, 0);
  return nn::fp8_quantize(t, scale, f).to(at::kDouble) / scale.to(at::kDouble);
}

double largest(const at::Tensor& t) { return t.abs().max().item<double>(); }

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(Fp8, FormatsSaturateInsteadOfOverflowing) {
  EXPECT_EQ(nn::fp8_max(Fp8Format::E4M3), 448.0);
  EXPECT_EQ(nn::fp8_max(Fp8Format::E5M2), 57344.0);
  const at::Tensor one = at::scalar_tensor(1.0, at::kFloat);
  // 500 and -1000 are beyond e4m3's 448 (a plain cast makes them NaN); 0.3 rounds to 0.3125 (3 mantissa bits).
  const at::Tensor q = nn::fp8_quantize(at::tensor({500.0f, -1000.0f, 0.3f, 0.0f}), one, Fp8Format::E4M3);
  EXPECT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_TRUE(at::equal(q.to(at::kFloat), at::tensor({448.0f, -448.0f, 0.3125f, 0.0f})));
  const at::Tensor g = nn::fp8_quantize(at::tensor({1e5f, 0.3f}), one, Fp8Format::E5M2);
  EXPECT_EQ(g.scalar_type(), at::kFloat8_e5m2);
  EXPECT_TRUE(at::equal(g.to(at::kFloat), at::tensor({57344.0f, 0.3125f})));
}

TEST(Fp8, ScaleMapsTheAmaxOntoTheFormatsLargestValue) {
  const auto scale = [](double a, Fp8Format f, int64_t margin) {
    return nn::fp8_scale(at::scalar_tensor(a, at::kFloat), f, margin).item<double>();
  };
  EXPECT_EQ(scale(2.0, Fp8Format::E4M3, 0), 224.0);
  EXPECT_EQ(scale(2.0, Fp8Format::E4M3, 1), 112.0);  // margin: a power of two of headroom
  EXPECT_EQ(scale(4.0, Fp8Format::E5M2, 0), 14336.0);
  // An all-zero tensor: a large finite scale (torchao's floor), never inf or NaN.
  EXPECT_TRUE(std::isfinite(scale(0.0, Fp8Format::E4M3, 0)));
  EXPECT_GT(scale(0.0, Fp8Format::E4M3, 0), 1e12);
  // The amax itself quantises to exactly the format's largest value.
  const at::Tensor x = at::tensor({-3.5f, 1.0f, 0.25f});
  const at::Tensor s = nn::fp8_scale(at::scalar_tensor(3.5, at::kFloat), Fp8Format::E4M3, 0);
  EXPECT_EQ(nn::fp8_quantize(x, s, Fp8Format::E4M3).to(at::kFloat)[0].item<float>(), -448.0f);
}

// y = x Wᵀ, dx = dy W, dW = dyᵀ x, each operand quantised as the recipe says, against float64.
TEST(Fp8, ForwardAndBackwardMatchAFloat64ReferenceOfTheSameQuantisation) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, 5, 24}).requires_grad_(true);  // [s, b, in]
  const at::Tensor w = (0.1 * at::randn({40, 24})).requires_grad_(true);
  const at::Tensor dy = 1e-3 * at::randn({3, 5, 40});
  Fp8Linear l(Fp8Recipe{}, {}, at::kCPU);
  const at::Tensor y = l.forward(x, w);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 40}));
  EXPECT_EQ(y.scalar_type(), at::kFloat);  // no autocast: x's dtype
  y.backward(dy);

  const at::Tensor xd = dequantised(x.detach(), Fp8Format::E4M3, largest(x.detach()));
  const at::Tensor wd = dequantised(w.detach(), Fp8Format::E4M3, largest(w.detach()));
  const at::Tensor gd = dequantised(dy, Fp8Format::E5M2, largest(dy));
  const at::Tensor y_ref = at::matmul(xd, wd.t());
  const at::Tensor dx_ref = at::matmul(gd, wd);
  const at::Tensor dw_ref = at::matmul(gd.reshape({-1, 40}).t(), xd.reshape({-1, 24}));
  // fp32 accumulation of 24 or 15 products: ~1e-7 relative.
  EXPECT_LT(rel(y, y_ref), 1e-6);
  EXPECT_LT(rel(x.grad(), dx_ref), 1e-6);
  EXPECT_LT(rel(w.grad(), dw_ref), 1e-6);
  // The gradient really went through e5m2: the e4m3 quantisation of dy gives another dx.
  const at::Tensor g4 = dequantised(dy, Fp8Format::E4M3, largest(dy));
  EXPECT_GT(rel(at::matmul(g4, wd), dx_ref), 1e-3);
  // And FP8 is not the fp32 product: it differs by the quantisation's rounding (~2^-4 relative).
  EXPECT_GT(rel(y, at::matmul(x.detach(), w.detach().t())), 1e-3);
}

TEST(Fp8, UnderAutocastTheProductIsBf16AndTheGradientsKeepTheirDtypes) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 16}).requires_grad_(true);
  const at::Tensor w = at::randn({8, 16}).requires_grad_(true);
  Fp8Linear l(Fp8Recipe{}, {}, at::kCPU);
  at::Tensor y;
  {
    AutocastGuard bf16(Precision::Fp8, c10::DeviceType::CPU);
    y = l.forward(x, w);
  }
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  // The product itself accumulates in fp32 under autocast too (CPU's emulation would
  // otherwise run its matmul in bf16): the fp32 product rounded once to bf16.
  EXPECT_TRUE(at::equal(y, l.forward(x, w).to(at::kBFloat16)));
  // And the backward equals one run with autocast on (a pipeline runs its backward so).
  const at::Tensor dy = at::randn({4, 8});
  const auto grads = [&](bool autocast) {
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
    const at::Tensor out = l.forward(x, w);
    std::optional<AutocastGuard> on;
    if (autocast) on.emplace(Precision::Fp8, c10::DeviceType::CPU);
    out.backward(dy);
    return std::pair{x.grad().clone(), w.grad().clone()};
  };
  const auto plain = grads(false), cast = grads(true);
  EXPECT_TRUE(at::equal(plain.first, cast.first));
  EXPECT_TRUE(at::equal(plain.second, cast.second));
  x.mutable_grad() = at::Tensor();
  w.mutable_grad() = at::Tensor();
  y.sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

TEST(Fp8, DelayedScalingKeepsTheMaxOfItsHistoryAndScalesTheFirstStepByTheTensor) {
  Fp8Linear l(Fp8Recipe{Fp8Scaling::Delayed, 2, 0}, {}, at::kCPU);
  const at::Tensor t = at::tensor({0.5f, -2.0f});
  // No history yet: the tensor's own amax (current scaling), recorded for the step.
  EXPECT_EQ(l.scale(Fp8Linear::kInput, t, true).item<float>(), 224.0f);
  EXPECT_FALSE(l.has_history());
  EXPECT_EQ(l.step_amax()[0].item<float>(), 2.0f);
  // Not recorded: evaluation (GradMode off).
  l.scale(Fp8Linear::kInput, 10 * t, false);
  EXPECT_EQ(l.step_amax()[0].item<float>(), 2.0f);

  l.push(at::tensor({1.0f, 2.0f, 4.0f}));
  EXPECT_TRUE(l.has_history());
  EXPECT_EQ(l.step_amax().abs().sum().item<float>(), 0.0f);  // a new step
  // The scale now comes from the history, whatever the tensor: the step's scales are fixed.
  EXPECT_EQ(l.scale(Fp8Linear::kInput, 100 * t, true).item<float>(), 448.0f);
  EXPECT_EQ(l.scale(Fp8Linear::kWeight, t, true).item<float>(), 224.0f);
  EXPECT_EQ(l.scale(Fp8Linear::kGrad, t, true).item<float>(), 14336.0f);
  EXPECT_EQ(l.step_amax()[0].item<float>(), 200.0f);  // but the amax is recorded for the next ones

  l.push(at::tensor({0.5f, 8.0f, 1.0f}));  // history [[0.5, 1], [8, 2], [1, 4]]: the max of each row
  EXPECT_EQ(l.scale(Fp8Linear::kInput, t, true).item<float>(), 448.0f);
  EXPECT_EQ(l.scale(Fp8Linear::kWeight, t, true).item<float>(), 56.0f);
  EXPECT_EQ(l.scale(Fp8Linear::kGrad, t, true).item<float>(), 14336.0f);
  l.push(at::tensor({0.25f, 0.5f, 0.5f}));  // the oldest (1, 2, 4) falls out of a history of 2
  EXPECT_TRUE(at::equal(l.history(), at::tensor({0.25f, 0.5f, 0.5f, 8.0f, 0.5f, 1.0f}).reshape({3, 2})));
  EXPECT_EQ(l.scale(Fp8Linear::kInput, t, true).item<float>(), 896.0f);
  EXPECT_EQ(l.scale(Fp8Linear::kGrad, t, true).item<float>(), 57344.0f);

  // A stale scale saturates: a tensor 10x larger than the history's amax is clamped at ±448.
  const at::Tensor big = at::tensor({-5.0f, 0.25f});  // x scale 896: -4480 saturates, 224 does not
  const at::Tensor q = nn::fp8_quantize(big, l.scale(Fp8Linear::kInput, big, true), Fp8Format::E4M3);
  EXPECT_TRUE(at::equal(q.to(at::kFloat), at::tensor({-448.0f, 224.0f})));

  // A restored history gives the same scales (a checkpoint's), bitwise.
  Fp8Linear r(Fp8Recipe{Fp8Scaling::Delayed, 2, 0}, {}, at::kCPU);
  r.restore(l.history());
  for (auto role : {Fp8Linear::kInput, Fp8Linear::kWeight, Fp8Linear::kGrad}) {
    EXPECT_TRUE(at::equal(r.scale(role, t, false), l.scale(role, t, false)));
  }
  Fp8Linear other(Fp8Recipe{Fp8Scaling::Delayed, 16, 0}, {}, at::kCPU);
  try {
    other.restore(l.history());
    ADD_FAILURE() << "a history of another length was restored";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.fp8_history = 2"), std::string::npos) << e.what();
  }
}

// Zero-bubble schedules defer the weight gradient to the W pass (nn/linear.h):
// the FP8 dW arrives then, equal to the one computed at once.
TEST(Fp8, TheWeightGradientCanBeDeferredToTheWPass) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({6, 16});
  const at::Tensor w1 = at::randn({8, 16}).requires_grad_(true);
  const at::Tensor w2 = w1.detach().clone().requires_grad_(true);
  Fp8Linear l(Fp8Recipe{}, {}, at::kCPU);
  l.forward(x, w1).sum().backward();
  nn::WeightGradStash stash;
  at::Tensor y;
  {
    nn::DeferWeightGrads defer;
    y = l.forward(x, w2);
  }
  {
    nn::WeightGradTarget target(&stash);
    y.sum().backward();
  }
  EXPECT_FALSE(w2.grad().defined());
  EXPECT_FALSE(stash.empty());
  stash.run();
  ASSERT_TRUE(w2.grad().defined());
  EXPECT_TRUE(at::equal(w1.grad(), w2.grad()));
}

// A whole model: FP8 (the blocks' linears) against bf16 from the same seed and
// data, 20 steps of AdamW at lr 1e-3 on llama-tiny (2 layers, seq 32). The FP8
// product rounds each operand to 3 mantissa bits (e4m3) or 2 (e5m2) where bf16
// keeps 8, so the losses part, but by a small bounded amount; FP8 must differ
// from bf16 (its linears really run in FP8) and the loss must fall as bf16's does.
TEST(Fp8, TrainsLikeBf16) {
  plan::ModelSpec spec = plan::preset("llama-tiny");
  spec.layers = 2;
  spec.seq = 32;
  spec.dropout = 0;
  Comm solo("solo", 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<std::vector<Batch>> data;
  for (int i = 0; i < 20; ++i) {
    // A learnable stream: each sequence counts up from a random start.
    const at::Tensor start = at::randint(spec.vocab, {2, 1}, gen, at::kLong);
    const at::Tensor d = (start + at::arange(spec.seq + 1, at::kLong)).remainder(spec.vocab);
    data.push_back({{d.narrow(1, 0, spec.seq).contiguous(), d.narrow(1, 1, spec.seq).contiguous(), {}, {}}});
  }
  AdamWOptions o;
  o.lr = 1e-3;
  o.schedule = LrSchedule::Constant;
  for (Fp8Scaling scaling : {Fp8Scaling::Current, Fp8Scaling::Delayed}) {
    Transformer a(spec, solo, false, 1), b(spec, solo, false, 1);
    Fp8Training fp8(Fp8Recipe{scaling, 16, 0}, {&b}, solo, solo);
    AdamW oa(a.params().params(), o), ob(b.params().params(), o);
    TrainStep sa(a, oa, solo, solo, {Precision::Bf16, nullptr}), sb(b, ob, solo, solo, {Precision::Fp8, nullptr});
    double worst = 0, first = 0, last = 0;
    bool differs = false;
    for (size_t i = 0; i < data.size(); ++i) {
      const StepResult ra = sa.run(data[i]), rb = sb.run(data[i]);
      fp8.end_step(solo, solo);
      worst = std::max(worst, std::abs(rb.loss - ra.loss) / ra.loss);
      differs = differs || rb.loss != ra.loss;
      if (i == 0) first = rb.loss;
      last = rb.loss;
    }
    std::printf("fp8 %s vs bf16 over 20 steps: largest relative loss difference %.2e\n", nn::to_string(scaling), worst);
    EXPECT_TRUE(differs);
    EXPECT_LT(worst, 2e-2) << nn::to_string(scaling);
    EXPECT_LT(last, 0.9 * first) << nn::to_string(scaling);
  }
}

// What FP8 is not tested with is one error before any rank starts, naming the value.
TEST(Fp8, UntestedCombinationsAreRefusedByName) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  // fp16 (the same list: its parity rows cover dense pretraining only) alike.
  for (const auto& [precision, label] : {std::pair{"fp8", "FP8"}, std::pair{"fp16", "fp16"}}) {
    const std::string p = std::string("train.precision=\"") + precision + "\"";
    EXPECT_EQ(test::error_of(cfg, {p, "train.method=\"sft\""}), "");
    for (const auto& [set, named] : std::vector<std::pair<std::string, std::string>>{
             {"train.method=\"dpo\"", "train.method = \"dpo\""},
             {"lora.rank=4", "lora.rank = 4 (LoRA, QLoRA)"},
             {"adapters.bottleneck=8", "adapters.bottleneck = 8"},
             {"model.experts=4", "model.experts = 4 (MoE)"}}) {
      std::vector<std::string> sets{p, set};
      if (set == "model.experts=4") sets.push_back("model.top_k=2");
      const std::string e = test::error_of(cfg, sets);
      EXPECT_NE(e.find(std::string("train.precision = \"") + precision + "\" with " + named + ": " + label +
                       " is tested on dense pretraining and SFT only"),
                std::string::npos)
          << set << ": " << e;
    }
  }
  EXPECT_NE(test::error_of(cfg, {"train.precision=\"fp8\"", "train.fp8_scaling=\"hybrid\""})
                .find("train.fp8_scaling 'hybrid' unknown; use current or delayed"),
            std::string::npos);
  EXPECT_NE(test::error_of(cfg, {"train.fp8_history=0"}).find("train.fp8_history"), std::string::npos);
}

TEST(Fp8, PrecisionAndScalingNames) {
  EXPECT_EQ(parse_train_precision("fp8"), Precision::Fp8);
  EXPECT_EQ(compute_dtype(Precision::Fp8), c10::ScalarType::BFloat16);
  EXPECT_EQ(nn::parse_fp8_scaling("delayed"), Fp8Scaling::Delayed);
  try {
    nn::parse_fp8_scaling("hybrid");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'hybrid' unknown; use current or delayed"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshtrain
