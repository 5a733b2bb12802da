// The fused output layer + cross-entropy split over the vocabulary (tp = the
// world size) against one process's unfused pair over the whole vocabulary;
// and the model under tp, with and without sequence parallelism, with the
// fused loss on and off.
//
// Tolerance (fp32), as test_fused_loss.cpp's: |parallel - single| <= 1e-5
// max|single| + 1e-7 per tensor (summation order only: the sum of
// exponentials and dX are added across ranks, dW chunk by chunk), the loss to
// 1e-6 relative. The model comparison uses the tensor-parallel parity
// tolerance (tests/parity.h).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/tensor/cross_entropy.h"
#include "meshtrain/parallel/tensor/fused_cross_entropy.h"
#include "tests/mp.h"
#include "tests/parity.h"
#include "tests/same_step.h"

namespace meshtrain::test {
namespace {

TEST(FusedLossParallel, VocabParallelEqualsOneProcess) {
  Comm& tp = runtime().world();
  Comm solo("solo", runtime().rank());
  constexpr int64_t n = 29, h = 12, padded = 72;  // 72 = 36, 24, 18 rows per rank at tp 2, 3, 4
  if (padded % tp.size() != 0) GTEST_SKIP() << "the test's 72 vocabulary rows need tp dividing 72";
  const int64_t local = padded / tp.size(), start = local * tp.rank();
  // vocab 50: at tp 4 the last rank's rows are all padding.
  for (int64_t vocab : {70, 50}) {
    for (bool uniform : {true, false}) {
      const std::string what = fmt::format("tp={} vocab={} uniform={}", tp.size(), vocab, uniform);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      const at::Tensor x0 = at::randn({n, h}, gen), w0 = at::randn({padded, h}, gen) * 0.5;
      at::Tensor targets = at::randint(vocab, {n}, gen, at::kLong);
      targets[7] = -1;
      const at::Tensor up = uniform ? at::full({n}, 0.25) : at::rand({n}, gen);
      at::Tensor x_ref = x0.clone().requires_grad_(), w_ref = w0.clone().requires_grad_();
      const at::Tensor ref = vocab_parallel_cross_entropy(at::mm(x_ref, w_ref.t()), targets, solo, 0, vocab);
      ref.backward(up);
      at::Tensor x = x0.clone().requires_grad_(), w = w0.narrow(0, start, local).clone().requires_grad_();
      const at::Tensor loss = fused_linear_cross_entropy(x, w, targets, tp, start, vocab, 8);
      loss.backward(up);
      expect_close(loss.detach(), ref.detach(), 1e-6, what + " loss");
      at::Tensor dx = x.grad().clone();
      tp.all_reduce(dx);  // each rank's dX is its slice's part (the head's tp entry sums them)
      expect_close(dx, x_ref.grad(), 1e-5, what + " dx");
      expect_close(gather_along(w.grad(), tp, 0), w_ref.grad(), 1e-5, what + " dw");
    }
  }
}

TEST(FusedLossParallel, TheModelUnderTpTrainsTheSameWithItOnAndOff) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool sp : {false, true}) {
    for (bool tied : {true, false}) {
      plan::ModelSpec m = plan::preset("llama-tiny");
      m.vocab = 100, m.seq = 16, m.layers = 2, m.hidden = 64, m.heads = 8, m.kv_heads = 4, m.ffn = 96;
      m.tied = tied, m.dropout = 0;
      const std::string what = fmt::format("tp={} sp={} tied={}", tp.size(), sp, tied);
      const TokenBatch b = random_batch(m, 1, 2);
      Transformer fused(m, tp, sp, 9), plain(m, tp, sp, 9);
      plain.set_fused_loss(false);
      expect_same_step(fused, plain, b, true, what, [&](const Param& f, const Param& p) {
        expect_grad_parity(whole_grad(f, tp), whole_grad(p, tp), f.name, m.vocab, what);
      });
    }
  }
}

}  // namespace
}  // namespace meshtrain::test
