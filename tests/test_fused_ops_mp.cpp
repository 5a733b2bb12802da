// The fused elementwise operations (nn/fused_ops.h) under tensor parallelism:
// the model on tp ranks, with and without sequence parallelism (the norms then
// run on sequence shards, their weights' gradients summed over tp), GPT and
// Llama shapes, with residual dropout, trains the same with them on and off.
// Tolerance: the tensor-parallel parity tolerance (tests/parity.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "tests/mp.h"
#include "tests/parity.h"
#include "tests/same_step.h"

namespace meshtrain::test {
namespace {

TEST(FusedOpsParallel, TheModelUnderTpTrainsTheSameWithThemOnAndOff) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    for (bool sp : {false, true}) {
      plan::ModelSpec m = plan::preset(preset);
      m.vocab = 100, m.seq = 16, m.layers = 2, m.hidden = 64, m.heads = 8, m.kv_heads = 8, m.ffn = 96;
      m.dropout = 0.1;
      const std::string what = fmt::format("{} tp={} sp={}", preset, tp.size(), sp);
      const TokenBatch b = random_batch(m, 1, 2);
      Transformer fused(m, tp, sp, 9), plain(m, tp, sp, 9);
      plain.set_fused_ops(false);
      expect_same_step(fused, plain, b, true, what, [&](const Param& f, const Param& p) {
        expect_grad_parity(whole_grad(f, tp), whole_grad(p, tp), f.name, m.vocab, what);
      });
    }
  }
}

}  // namespace
}  // namespace meshtrain::test
