// Mixed precision in one process: bf16 compute keeps fp32 master weights and
// fp32 gradients close to the fp32 run; the loss scaler is exact without
// overflow, skips the step on an injected inf and follows its schedule; fp16
// computes near fp32 with fp32 masters.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <limits>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/train/step.h"

namespace meshtrain {
namespace {

plan::ModelSpec tiny() {
  plan::ModelSpec m = plan::preset("llama-tiny");
  m.layers = 2;
  m.seq = 32;
  m.dropout = 0;
  return m;
}

std::vector<Batch> batches(const plan::ModelSpec& m, int n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    at::Tensor d = at::randint(m.vocab, {2, m.seq + 1}, gen, at::kLong);
    out.push_back({d.narrow(1, 0, m.seq).contiguous(), d.narrow(1, 1, m.seq).contiguous(), {}, {}});
  }
  return out;
}

AdamWOptions constant_lr() {
  AdamWOptions o;
  o.lr = 1e-3;
  o.schedule = LrSchedule::Constant;
  return o;
}

// The cosine between two models' gradients (all parameters as one vector), after checking that
// `b`'s parameters and gradients are fp32 (mixed precision keeps its masters and gradients fp32).
double fp32_gradient_cosine(Transformer& a, Transformer& b) {
  std::vector<at::Tensor> fa, fb;
  for (size_t i = 0; i < a.params().params().size(); ++i) {
    const auto& pb = b.params().params()[i];
    EXPECT_EQ(pb.tensor.scalar_type(), at::kFloat) << pb.name;
    EXPECT_EQ(pb.tensor.grad().scalar_type(), at::kFloat) << pb.name;
    fa.push_back(a.params().params()[i].tensor.grad().reshape({-1}));
    fb.push_back(pb.tensor.grad().reshape({-1}));
  }
  const at::Tensor ga = at::cat(fa).to(at::kDouble), gb = at::cat(fb).to(at::kDouble);
  return (ga * gb).sum().item<double>() / (ga.norm().item<double>() * gb.norm().item<double>());
}

// bf16 rounds activations to 8 bits of mantissa (relative 2^-8 = 0.4%): the
// loss of the bf16 forward is within 1% of fp32's, and the gradients point the
// same way (cosine similarity > 0.99). Master weights and gradients stay fp32.
TEST(Precision, Bf16ComputesWithFp32MasterWeightsAndGradients) {
  const plan::ModelSpec spec = tiny();
  Comm solo("solo", 0);
  Transformer a(spec, solo, false, 1), b(spec, solo, false, 1);
  AdamW oa(a.params().params(), constant_lr()), ob(b.params().params(), constant_lr());
  const auto data = batches(spec, 2);
  StepResult ra = TrainStep(a, oa, solo, solo).run(data);
  StepResult rb = TrainStep(b, ob, solo, solo, {Precision::Bf16, nullptr}).run(data);
  EXPECT_NEAR(rb.loss, ra.loss, 0.01 * ra.loss);
  EXPECT_GT(fp32_gradient_cosine(a, b), 0.99);
  EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 0.05 * ra.grad_norm);
}

// fp16 (libtorch 2.11 has its CPU kernels): the forward in fp16 (10 mantissa bits) within 1% of
// fp32's loss, gradients pointing the same way, fp32 masters and gradients; the loss scaler is
// required, and its first scale (2^16) leaves this model's gradients finite (no step skipped).
TEST(Precision, Fp16ComputesWithFp32MasterWeightsAndALossScaler) {
  EXPECT_THROW(parse_train_precision("fp4"), std::invalid_argument);
  const plan::ModelSpec spec = tiny();
  Comm solo("solo", 0);
  Transformer a(spec, solo, false, 1), b(spec, solo, false, 1);
  AdamW oa(a.params().params(), constant_lr()), ob(b.params().params(), constant_lr());
  // fp16 without a scaler is refused before anything runs.
  EXPECT_THROW(TrainStep(b, ob, solo, solo, {Precision::Fp16, nullptr}), std::invalid_argument);
  LossScaler scaler;
  const auto data = batches(spec, 2);
  const StepResult ra = TrainStep(a, oa, solo, solo).run(data);
  const StepResult rb = TrainStep(b, ob, solo, solo, {Precision::Fp16, &scaler}).run(data);
  EXPECT_FALSE(rb.skipped);
  EXPECT_EQ(rb.loss_scale, 65536.0);
  EXPECT_NEAR(rb.loss, ra.loss, 0.01 * ra.loss);
  EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 0.05 * ra.grad_norm);
  EXPECT_GT(fp32_gradient_cosine(a, b), 0.99);
}

// Powers of two scale exactly: with a scaler (and no overflow), three steps
// give bitwise the weights of three unscaled steps.
TEST(LossScaler, ScalingIsExactWithoutOverflow) {
  const plan::ModelSpec spec = tiny();
  Comm solo("solo", 0);
  Transformer a(spec, solo, false, 1), b(spec, solo, false, 1);
  AdamW oa(a.params().params(), constant_lr()), ob(b.params().params(), constant_lr());
  LossScaler scaler(1024.0, 2);
  TrainStep plain(a, oa, solo, solo), scaled(b, ob, solo, solo, {Precision::Fp32, &scaler});
  for (int s = 0; s < 3; ++s) {
    const auto data = batches(spec, 1);
    StepResult ra = plain.run(data), rb = scaled.run(data);
    EXPECT_FALSE(rb.skipped);
    EXPECT_EQ(ra.loss, rb.loss);
  }
  EXPECT_EQ(scaler.scale(), 2048.0);  // doubled after growth_interval = 2 clean steps
  for (size_t i = 0; i < a.params().params().size(); ++i) {
    EXPECT_TRUE(at::equal(a.params().params()[i].tensor, b.params().params()[i].tensor));
  }
}

// An inf injected into one gradient (a hook on a parameter, as an fp16
// overflow would produce): the step is skipped, no weight and no optimizer
// state moves, the scale halves; the next clean step updates again.
TEST(LossScaler, SkipsTheStepOnInf) {
  const plan::ModelSpec spec = tiny();
  Comm solo("solo", 0);
  Transformer m(spec, solo, false, 1);
  AdamW opt(m.params().params(), constant_lr());
  LossScaler scaler;  // 2^16, 2000
  EXPECT_EQ(scaler.scale(), 65536.0);
  TrainStep step(m, opt, solo, solo, {Precision::Fp32, &scaler});
  bool inject = true;
  at::Tensor victim = m.params().params()[3].tensor;
  victim.register_hook([&inject](const at::Tensor& g) {
    return inject ? g * std::numeric_limits<float>::infinity() : g;
  });
  std::vector<at::Tensor> before;
  for (const auto& p : m.params().params()) before.push_back(p.tensor.detach().clone());
  StepResult r = step.run(batches(spec, 1));
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(std::isnan(r.grad_norm));
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.state().skipped, 1);
  EXPECT_EQ(opt.steps(), 0);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], m.params().params()[i].tensor));
  EXPECT_EQ(opt.exp_avg()[0].abs().sum().item<float>(), 0.0f);
  inject = false;
  r = step.run(batches(spec, 1));
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_FALSE(at::equal(before[0], m.params().params()[0].tensor));
}

TEST(LossScaler, GrowthAndBackoffSchedule) {
  LossScaler s(8.0, 3);
  for (int i = 0; i < 3; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 16.0);
  s.update(true);
  s.update(false);  // resets the clean-step count
  EXPECT_EQ(s.scale(), 8.0);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 8.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 16.0);
  LossScalerState st = s.state();
  LossScaler t;
  t.restore(st);
  EXPECT_EQ(t.scale(), 16.0);
  EXPECT_EQ(t.state().skipped, 1);
  EXPECT_THROW(LossScaler(0.0), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
