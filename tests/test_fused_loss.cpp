// The fused output layer + cross-entropy (parallel/tensor/fused_cross_entropy.h)
// against its unfused composition: the linear, then the vocabulary-parallel
// cross-entropy, in one process (tp = 1; the tp > 1 cases are in
// test_fused_loss_mp.cpp).
//
// Tolerance (fp32): the two differ in summation order only (dW accumulated
// chunk by chunk; the upstream gradient applied after the matrix multiply
// instead of before), so |fused - unfused| <= 1e-5 max|unfused| + 1e-7 per
// tensor, and 1e-6 relative on the loss. bf16 (autocast): both multiply in
// bf16 (unit roundoff u = 2^-8); the unfused rounds dW to bf16 once, the fused
// rounds each chunk's product and adds them in fp32: within 4u max|unfused|.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/recompute.h"
#include "meshtrain/parallel/tensor/cross_entropy.h"
#include "meshtrain/parallel/tensor/fused_cross_entropy.h"
#include "meshtrain/parallel/tensor/tied_grad.h"
#include "meshtrain/train/precision.h"
#include "tests/accumulator_watch.h"
#include "tests/parity.h"
#include "tests/same_step.h"

namespace meshtrain::test {
namespace {

constexpr int64_t kN = 37, kH = 16, kVocab = 70, kPadded = 72;

struct Case {
  at::Tensor x, w, targets, upstream;
};

// x [37, 16], W [72, 16] (two padded rows), targets with two ignored; `uniform`:
// the upstream gradient 1/count on every token (a mean loss), else random per token.
Case make_case(bool uniform) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  Case c;
  c.x = at::randn({kN, kH}, gen);
  c.w = at::randn({kPadded, kH}, gen) * 0.5;
  c.targets = at::randint(kVocab, {kN}, gen, at::kLong);
  c.targets[3] = -1;
  c.targets[20] = -1;
  c.upstream = uniform ? at::full({kN}, 1.0 / (kN - 2)) : at::rand({kN}, gen) - 0.3;
  return c;
}

struct Result {
  at::Tensor loss, dx, dw;
};

// chunk < 0: the unfused pair; else the fused op with that many rows per chunk (0: default).
Result run(const Case& c, int64_t chunk) {
  Comm solo("solo", 0);
  at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
  at::Tensor loss = chunk < 0 ? vocab_parallel_cross_entropy(at::mm(x, w.t()), c.targets, solo, 0, kVocab)
                              : fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, chunk);
  loss.backward(c.upstream);
  return {loss.detach(), x.grad(), w.grad()};
}

void expect_equal_results(const Result& fused, const Result& ref, const std::string& what) {
  expect_close(fused.loss, ref.loss, 1e-6, what + " loss");
  expect_close(fused.dx, ref.dx, 1e-5, what + " dx");
  expect_close(fused.dw, ref.dw, 1e-5, what + " dw");
}

TEST(FusedLoss, EqualsTheLinearAndCrossEntropy) {
  for (bool uniform : {true, false}) {
    const Case c = make_case(uniform);
    const Result ref = run(c, -1);
    // Padded rows get no gradient, ignored tokens no loss.
    ASSERT_EQ(ref.dw.narrow(0, kVocab, kPadded - kVocab).abs().max().item<double>(), 0.0);
    for (int64_t chunk : {0, 1, 8, 36, 37, 100}) {
      const std::string what = fmt::format("uniform={} chunk={}", uniform, chunk);
      const Result fused = run(c, chunk);
      expect_equal_results(fused, ref, what);
      EXPECT_EQ(fused.dw.narrow(0, kVocab, kPadded - kVocab).abs().max().item<double>(), 0.0) << what;
      EXPECT_EQ(fused.loss[3].item<double>(), 0.0) << what;
      EXPECT_EQ(fused.dx[20].abs().max().item<double>(), 0.0) << what;
    }
  }
}

TEST(FusedLoss, WithoutGradientsFrozenWeightsAndASecondBackward) {
  const Case c = make_case(true);
  const Result ref = run(c, -1);
  Comm solo("solo", 0);
  {
    at::NoGradGuard no_grad;
    const at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
    expect_close(fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, 8), ref.loss, 1e-6, "no-grad loss");
  }
  {  // A frozen head (adapters train elsewhere): dX only.
    at::Tensor x = c.x.clone().requires_grad_();
    fused_linear_cross_entropy(x, c.w, c.targets, solo, 0, kVocab, 8).backward(c.upstream);
    expect_close(x.grad(), ref.dx, 1e-5, "frozen-weight dx");
  }
  {  // retain_graph: the second backward recomputes (the first consumed the forward's gradients).
    at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
    at::Tensor loss = fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, 8);
    loss.backward(c.upstream, /*retain_graph=*/true);
    loss.backward(c.upstream);
    expect_close(x.grad(), ref.dx * 2, 1e-5, "twice dx");
    expect_close(w.grad(), ref.dw * 2, 1e-5, "twice dw");
  }
}

// A head whose .grad exists (DDP's bucket view, a later micro-batch): the backward adds the scaled
// dW into it in one pass and hands AccumulateGrad nothing (nn/linear.h's fused accumulation).
TEST(FusedLoss, AnExistingGradGetsTheScaledDwAddedInPlace) {
  for (bool uniform : {true, false}) {
    const Case c = make_case(uniform);
    const Result ref = run(c, -1);
    Comm solo("solo", 0);
    at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
    const at::Tensor bucket = at::full({kPadded * kH + 3}, 0.5);
    w.mutable_grad() = bucket.narrow(0, 3, kPadded * kH).view({kPadded, kH});
    const auto [acc, handed] = watch_accumulator(w);
    fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, 8).backward(c.upstream);
    const std::string what = fmt::format("uniform={}", uniform);
    EXPECT_FALSE(*handed) << what << ": AccumulateGrad got a dW to add";
    EXPECT_EQ(w.grad().data_ptr(), bucket.narrow(0, 3, kPadded * kH).data_ptr()) << what;
    expect_close(w.grad() - 0.5, ref.dw, 1e-5, what + " dw");
    expect_close(x.grad(), ref.dx, 1e-5, what + " dx");
  }
}

TEST(FusedLoss, ZeroBubbleDefersTheWeightGradient) {
  const Case c = make_case(true);
  const Result ref = run(c, -1);
  Comm solo("solo", 0);
  at::Tensor x = c.x.clone().requires_grad_(), w = c.w.clone().requires_grad_();
  at::Tensor loss;
  {
    nn::DeferWeightGrads split;
    loss = fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, 8);
  }
  nn::WeightGradStash stash;
  {
    nn::WeightGradTarget into(&stash);
    loss.backward(c.upstream);
  }
  EXPECT_FALSE(w.grad().defined()) << "the W pass, not B, adds the weight gradient";
  expect_close(x.grad(), ref.dx, 1e-5, "B's dx");
  ASSERT_FALSE(stash.empty());
  stash.run();
  expect_close(w.grad(), ref.dw, 1e-5, "W's dw");
}

TEST(FusedLoss, Bf16WithinItsBound) {
  for (bool uniform : {true, false}) {
    const Case c = make_case(uniform);
    Result fused, ref;
    {
      AutocastGuard bf16(Precision::Bf16);
      ref = run(c, -1);
      fused = run(c, 8);
    }
    const std::string what = fmt::format("bf16 uniform={}", uniform);
    constexpr double u = 1.0 / 256;
    expect_close(fused.loss, ref.loss, 4 * u, what + " loss");
    expect_close(fused.dx, ref.dx, 4 * u, what + " dx");
    expect_close(fused.dw, ref.dw, 4 * u, what + " dw");
    EXPECT_EQ(fused.dw.scalar_type(), at::kFloat) << what;
  }
}

// A tied head (tied_grad.h): the lookup's rows go into the loss's dW, which autograd then
// delivers as the weight's gradient; equal to at::embedding + the unfused pair. The lookup feeds
// the loss through a product, so both gradients of W are non-trivial. Without the loss's offer
// (another weight, a chunked backward that recomputes) the lookup's gradient is dense.
TEST(FusedLoss, ATiedLookupAddsItsRowsIntoTheLossesDw) {
  Comm solo("solo", 0);
  for (bool uniform : {true, false}) {
    const Case c = make_case(uniform);
    const at::Tensor ids = c.targets.abs();  // [37] in [0, 70)
    at::Tensor ref_w = c.w.clone().requires_grad_();
    const at::Tensor ref_x = at::embedding(ref_w, ids) * c.x;
    vocab_parallel_cross_entropy(at::mm(ref_x, ref_w.t()), c.targets, solo, 0, kVocab).backward(c.upstream);
    for (bool offered : {true, false}) {
      const std::string what = fmt::format("uniform={} offered={}", uniform, offered);
      at::Tensor w = c.w.clone().requires_grad_();
      const TiedGrad tied(offered ? w : at::Tensor());
      const at::Tensor x = tied_lookup(w, ids, tied) * c.x;
      fused_linear_cross_entropy(x, w, c.targets, solo, 0, kVocab, 8, &tied).backward(c.upstream);
      EXPECT_EQ(tied.merged(), offered ? 1 : 0) << what;
      EXPECT_FALSE(tied.take().defined()) << what;  // the lookup emptied the slot
      expect_close(w.grad(), ref_w.grad(), 1e-5, what + " dW");
    }
    // Two forwards through the weight, one backward of their sum: the second loss's dW is summed
    // with the first's before either lookup runs, so neither merges, and the gradient is still whole.
    at::Tensor ref2 = c.w.clone().requires_grad_();
    at::Tensor w = c.w.clone().requires_grad_();
    at::Tensor sum_ref, sum;
    std::vector<TiedGrad> slots;
    for (int64_t k = 0; k < 2; ++k) {
      const at::Tensor ids_k = (ids + k) % kVocab;
      const at::Tensor lr = vocab_parallel_cross_entropy(at::mm(at::embedding(ref2, ids_k) * c.x, ref2.t()), c.targets,
                                                         solo, 0, kVocab);
      slots.emplace_back(w);
      const at::Tensor l = fused_linear_cross_entropy(tied_lookup(w, ids_k, slots.back()) * c.x, w, c.targets, solo, 0,
                                                      kVocab, 8, &slots.back());
      sum_ref = k == 0 ? lr : sum_ref + lr;
      sum = k == 0 ? l : sum + l;
    }
    sum_ref.backward(c.upstream);
    sum.backward(c.upstream);
    expect_close(w.grad(), ref2.grad(), 1e-5, fmt::format("uniform={} two forwards dW", uniform));
  }
}

TEST(FusedLoss, ShapeErrorsAreClear) {
  Comm solo("solo", 0);
  const at::Tensor x = at::zeros({4, 8}), w = at::zeros({16, 8}), t = at::zeros({4}, at::kLong);
  EXPECT_THROW(fused_linear_cross_entropy(x, at::zeros({16, 7}), t, solo, 0, 16), std::invalid_argument);
  EXPECT_THROW(fused_linear_cross_entropy(x, w, at::zeros({5}, at::kLong), solo, 0, 16), std::invalid_argument);
  EXPECT_THROW(fused_linear_cross_entropy(x, w, t, solo, 0, 16, -1), std::invalid_argument);
  EXPECT_EQ(default_chunk_rows(1024, 50304, 256), 256);   // 64 MiB holds 333 rows of 50304 fp32 logits
  EXPECT_EQ(default_chunk_rows(1024, 50304, 768), 512);  // at least h rows a chunk: two chunks of 512
  EXPECT_EQ(default_chunk_rows(8192, 128256, 4096), 4096);  // Llama 3 8B: 2 chunks, not 64 of 130 rows
  EXPECT_EQ(default_chunk_rows(10, 50304, 768), 10);
}

// The model with the fused loss on (the default) and off: same loss and gradients,
// tied and untied heads, with full recomputation.
TEST(FusedLoss, TheModelTrainsTheSameWithItOnAndOff) {
  for (bool tied : {true, false}) {
    for (auto recompute : {nn::Recompute::None, nn::Recompute::Full}) {
      plan::ModelSpec m = plan::preset("gpt-tiny");
      m.vocab = 100, m.seq = 16, m.layers = 2, m.tied = tied, m.dropout = 0;
      const TokenBatch b = random_batch(m, 1, 5);
      Comm solo("solo", 0);
      Transformer fused(m, solo, false, 3), plain(m, solo, false, 3);
      plain.set_fused_loss(false);
      ASSERT_TRUE(fused.fused_loss());
      const std::string what = fmt::format("tied={} recompute={}", tied, static_cast<int>(recompute));
      fused.set_recompute(recompute);
      plain.set_recompute(recompute);
      expect_same_step(fused, plain, b, false, what, [&](const Param& f, const Param& p) {
        ASSERT_FALSE(f.tensor.grad().is_sparse()) << what << " " << f.name;
        expect_close(f.tensor.grad(), p.tensor.grad(), 1e-5, what + " " + f.name);
      });
    }
  }
}

}  // namespace
}  // namespace meshtrain::test
