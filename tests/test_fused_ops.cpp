// The fused elementwise operations (nn/fused_ops.h) against their unfused
// compositions, forward and every gradient, and the model with them on and off.
//
// Tolerances. fp32: |fused - composition| <= 1e-5 max|composition| + 1e-7 per
// tensor (expect_close): both compute in fp32 with different roundings (the
// fused GELU and SiLU use an exponential good to about 1 ulp; sums run in a
// different order). bf16: the fused op computes in fp32 and rounds once, so
// each bf16 output is the fp32 fused op's output on the same values, correctly
// rounded: |bf16 - fp32| <= 2^-8 |fp32| per element (half an ulp); and the bias
// gradient, summed before rounding, is the fp32 one bitwise. Shapes are odd (21
// rows of 37) so that no loop's vector width or 16-row block divides them.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/fused_ops.h"
#include "meshtrain/nn/keyed_dropout.h"
#include "tests/parity.h"
#include "tests/same_step.h"

namespace meshtrain::test {
namespace {

constexpr double kRel = 1e-5;  // see above

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(); }

std::vector<at::Tensor> grads(const std::vector<at::Tensor>& leaves) {
  std::vector<at::Tensor> out;
  for (const auto& t : leaves) out.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return out;
}

// Every element of the bf16 `a` is the fp32 `b` rounded to nearest (within half an ulp).
void expect_rounded(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.scalar_type(), at::kBFloat16) << what;
  const at::Tensor err = (a.to(at::kFloat) - b).abs() - b.abs() * std::ldexp(1.0, -8);
  const int64_t i = err.argmax().item<int64_t>();
  EXPECT_LE(err.max().item<double>(), 0.0) << what << ": " << a.reshape(-1)[i].item<float>() << " vs "
                                           << b.reshape(-1)[i].item<float>();
}

struct Case {
  std::vector<at::Tensor> in;  // the leaves, fp32
  at::Tensor up;               // the output's upstream gradient
};

TEST(FusedOps, BiasGeluEqualsItsComposition) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor x0 = at::randn({7, 3, 37}, gen) * 2, b0 = at::randn({37}, gen), up = at::randn({7, 3, 37}, gen);
  for (bool with_bias : {true, false}) {
    const std::string what = fmt::format("bias={}", with_bias);
    at::Tensor x = leaf(x0), b = with_bias ? leaf(b0) : at::Tensor();
    at::Tensor xr = leaf(x0), br = with_bias ? leaf(b0) : at::Tensor();
    const at::Tensor y = nn::bias_gelu(x, b), yr = nn::bias_gelu_reference(xr, br);
    expect_close(y, yr, kRel, what + " y");
    y.backward(up);
    yr.backward(up);
    expect_close(x.grad(), xr.grad(), kRel, what + " dx");
    if (with_bias) expect_close(b.grad(), br.grad(), kRel, what + " dbias");
    // bf16 input (autocast's GEMM output), fp32 bias: the fp32 op on the same values, rounded once.
    at::Tensor x16 = leaf(x0.to(at::kBFloat16)), b16 = with_bias ? leaf(b0) : at::Tensor();
    at::Tensor x32 = leaf(x0.to(at::kBFloat16).to(at::kFloat)), b32 = with_bias ? leaf(b0) : at::Tensor();
    const at::Tensor y16 = nn::bias_gelu(x16, b16), y32 = nn::bias_gelu(x32, b32);
    expect_rounded(y16, y32, what + " bf16 y");
    const at::Tensor up16 = up.to(at::kBFloat16);
    y16.backward(up16);
    y32.backward(up16.to(at::kFloat));
    expect_rounded(x16.grad(), x32.grad(), what + " bf16 dx");
    if (with_bias) EXPECT_TRUE(at::equal(b16.grad(), b32.grad())) << what << " bf16 dbias";
  }
}

TEST(FusedOps, SwigluEqualsItsComposition) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const at::Tensor g0 = at::randn({21, 37}, gen) * 3, u0 = at::randn({21, 37}, gen), up = at::randn({21, 37}, gen);
  at::Tensor g = leaf(g0), u = leaf(u0), gr = leaf(g0), ur = leaf(u0);
  const at::Tensor y = nn::swiglu(g, u), yr = nn::swiglu_reference(gr, ur);
  expect_close(y, yr, kRel, "y");
  y.backward(up);
  yr.backward(up);
  expect_close(g.grad(), gr.grad(), kRel, "dgate");
  expect_close(u.grad(), ur.grad(), kRel, "dup");
  auto as16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  at::Tensor g16 = leaf(as16(g0)), u16 = leaf(as16(u0)), g32 = leaf(as16(g0).to(at::kFloat)),
             u32 = leaf(as16(u0).to(at::kFloat));
  const at::Tensor y16 = nn::swiglu(g16, u16), y32 = nn::swiglu(g32, u32);
  expect_rounded(y16, y32, "bf16 y");
  y16.backward(as16(up));
  y32.backward(as16(up).to(at::kFloat));
  expect_rounded(g16.grad(), g32.grad(), "bf16 dgate");
  expect_rounded(u16.grad(), u32.grad(), "bf16 dup");
}

TEST(FusedOps, NormsEqualTheirComposition) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x0 = at::randn({7, 3, 37}, gen) * 3 + 1, w0 = at::randn({37}, gen), b0 = at::randn({37}, gen);
  const at::Tensor up = at::randn({7, 3, 37}, gen);
  for (int kind = 0; kind < 3; ++kind) {  // LayerNorm, LayerNorm without a shift, RMSNorm
    const std::string what = std::vector<std::string>{"layernorm", "layernorm w/o bias", "rmsnorm"}[kind];
    at::Tensor x = leaf(x0), w = leaf(w0), b = kind == 0 ? leaf(b0) : at::Tensor();
    at::Tensor xr = leaf(x0), wr = leaf(w0), br = kind == 0 ? leaf(b0) : at::Tensor();
    const at::Tensor y = nn::norm(x, {w, b, 1e-5, kind == 2}), yr = nn::norm_reference(xr, {wr, br, 1e-5, kind == 2});
    expect_close(y, yr, kRel, what + " y");
    y.backward(up);
    yr.backward(up);
    expect_close(x.grad(), xr.grad(), kRel, what + " dx");
    expect_close(w.grad(), wr.grad(), kRel, what + " dw");
    if (kind == 0) expect_close(b.grad(), br.grad(), kRel, what + " db");
  }
}

// sum = residual + dropout(branch + bias), normed = norm(sum); both outputs
// used downstream (as in a block), or only the normed one.
TEST(FusedOps, AddNormEqualsItsComposition) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor r0 = at::randn({7, 3, 37}, gen), a0 = at::randn({7, 3, 37}, gen) * 2;
  const at::Tensor bias0 = at::randn({37}, gen), w0 = at::randn({37}, gen), nb0 = at::randn({37}, gen);
  const at::Tensor up_sum = at::randn({7, 3, 37}, gen), up_norm = at::randn({7, 3, 37}, gen);
  int cases = 0;
  for (int norm : {0, 1, 2}) {  // none, LayerNorm, RMSNorm
    for (bool with_bias : {true, false}) {
      for (double p : {0.0, 0.3}) {
        for (bool bf16 : {false, true}) {
          for (bool sum_used : {true, false}) {
            if (!sum_used && norm == 0) continue;
            const std::string what =
                fmt::format("norm={} bias={} p={} bf16={} sum used={}", norm, with_bias, p, bf16, sum_used);
            const at::Tensor branch0 = bf16 ? a0.to(at::kBFloat16) : a0;
            at::Tensor keep;
            if (p > 0) keep = nn::keyed_keep(11, p, {nn::span(0, 7), nn::span(0, 3), nn::span(0, 37)}, branch0);
            struct Run {
              at::Tensor r, a, bias, w, nb;
            };
            // The composition runs in fp32 on the same values (the fused op computes in fp32).
            auto run = [&](bool fused) {
              const at::Tensor a = fused ? branch0 : branch0.to(at::kFloat);
              Run x{leaf(r0), leaf(a), with_bias ? leaf(bias0) : at::Tensor(), norm ? leaf(w0) : at::Tensor(),
                    norm == 1 ? leaf(nb0) : at::Tensor()};
              const nn::NormWeights n{x.w, x.nb, 1e-5, norm == 2};
              const nn::BranchJoin j{x.bias, fused || !keep.defined() ? keep : keep.to(at::kFloat), p};
              const auto [sum, normed] = fused ? nn::add_norm(x.r, x.a, j, n) : nn::add_norm_reference(x.r, x.a, j, n);
              at::Tensor loss = at::zeros({});
              if (sum_used) loss = loss + (sum * up_sum).sum();
              if (norm) loss = loss + (normed * up_norm).sum();
              loss.backward();
              return std::tuple{sum.detach(), normed.defined() ? normed.detach() : at::Tensor(), x};
            };
            const auto [sum, normed, f] = run(true);
            const auto [sum_r, normed_r, u] = run(false);
            expect_close(sum, sum_r, kRel, what + " sum");
            if (norm) expect_close(normed, normed_r, kRel, what + " normed");
            expect_close(f.r.grad(), u.r.grad(), kRel, what + " d residual");
            ASSERT_EQ(f.a.grad().scalar_type(), branch0.scalar_type()) << what;
            if (bf16) {  // the fp32 gradient (to kRel) rounded to bf16: within an ulp
              const at::Tensor d = f.a.grad().to(at::kFloat), dr = u.a.grad();
              EXPECT_LE(((d - dr).abs() - dr.abs() * std::ldexp(1.0, -8)).max().item<double>(), 1e-7) << what;
            } else {
              expect_close(f.a.grad(), u.a.grad(), kRel, what + " d branch");
            }
            if (with_bias) expect_close(f.bias.grad(), u.bias.grad(), kRel, what + " d bias");
            if (norm) expect_close(f.w.grad(), u.w.grad(), kRel, what + " d weight");
            if (norm == 1) expect_close(f.nb.grad(), u.nb.grad(), kRel, what + " d shift");
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 40);
}

TEST(FusedOps, OtherTypesRunTheComposition) {
  const at::Tensor x = at::randn({4, 6}, at::kDouble), w = at::randn({6}, at::kDouble);
  EXPECT_TRUE(at::equal(nn::bias_gelu(x, w), nn::bias_gelu_reference(x, w)));
  EXPECT_TRUE(at::equal(nn::swiglu(x, x), nn::swiglu_reference(x, x)));
  EXPECT_TRUE(at::equal(nn::norm(x, {w, w}), nn::norm_reference(x, {w, w})));
  EXPECT_EQ(nn::norm(x, {w, w}).scalar_type(), at::kDouble);
}

// The model with the fused operations on (the default) and off: the same loss and
// gradients, GPT (LayerNorm, biases, GELU) and Llama (RMSNorm, SwiGLU) shapes, with
// residual dropout (the same masks) and each recomputation.
TEST(FusedOps, TheModelTrainsTheSameWithThemOnAndOff) {
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    for (auto recompute : {nn::Recompute::None, nn::Recompute::Selective, nn::Recompute::Full}) {
      plan::ModelSpec m = plan::preset(preset);
      m.vocab = 100, m.seq = 16, m.layers = 2, m.dropout = 0.1;
      const TokenBatch b = random_batch(m, 1, 5);
      Comm solo("solo", 0);
      Transformer fused(m, solo, false, 3), plain(m, solo, false, 3);
      plain.set_fused_ops(false);
      ASSERT_TRUE(fused.fused_ops());
      const std::string what = fmt::format("{} recompute={}", preset, static_cast<int>(recompute));
      fused.set_recompute(recompute);
      plain.set_recompute(recompute);
      expect_same_step(fused, plain, b, false, what, [&](const Param& f, const Param& p) {
        expect_close(f.tensor.grad(), p.tensor.grad(), kRel, what + " " + f.name);
      });
    }
  }
}

}  // namespace
}  // namespace meshtrain::test
