// Parity tests' shared parts: a random token batch (2 sequences of the
// model's length, targets shifted by one, one target ignored (-1), and the
// count of the rest: the loss normaliser), and the gradient comparison with
// the tensor-parallel parity tolerance.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/plan/spec.h"

namespace meshtrain::test {

struct TokenBatch {
  at::Tensor tokens, targets;
  double count;
};

inline TokenBatch random_batch(const plan::ModelSpec& m, int64_t ignored_row, int64_t ignored_col) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor data = at::randint(m.vocab, {2, m.seq + 1}, gen, at::kLong);
  TokenBatch b{data.narrow(1, 0, m.seq).contiguous(), data.narrow(1, 1, m.seq).contiguous(), 0};
  b.targets[ignored_row][ignored_col] = -1;
  b.count = static_cast<double>((b.targets >= 0).sum().item<int64_t>());
  return b;
}

// |g - g_ref| <= 1e-4 max|g_ref| + 1e-7 over the unpadded vocabulary rows of
// embed/head weights (the runs differ only in summation order: a few ulps times
// sqrt(fan-in)); padded rows of `g` must have no gradient.
inline void expect_grad_parity(at::Tensor g, at::Tensor g_ref, const std::string& name, int64_t vocab,
                               const std::string& what) {
  if (name == "embed.weight" || name == "head.weight") {
    EXPECT_EQ(g.narrow(0, vocab, g.size(0) - vocab).abs().max().item<double>(), 0.0) << what << " " << name;
    g = g.narrow(0, 0, vocab);
    g_ref = g_ref.narrow(0, 0, vocab);
  }
  const double scale = g_ref.abs().max().item<double>();
  const double err = (g - g_ref).abs().max().item<double>();
  EXPECT_LE(err, 1e-4 * scale + 1e-7) << what << " " << name << ": gradient error " << err << " (scale " << scale
                                      << ")";
}

// |a - b| <= rel max|b| + 1e-7 (the fused ops' tests state their `rel`).
inline void expect_close(const at::Tensor& a, const at::Tensor& b, double rel, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  const double scale = b.abs().max().item<double>();
  const double err = (a - b).abs().max().item<double>();
  EXPECT_LE(err, rel * scale + 1e-7) << what << ": error " << err << " (scale " << scale << ")";
}

}  // namespace meshtrain::test
