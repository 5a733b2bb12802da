// Tiled attention (nn/tiled_attention.h) against a float64 attention that
// materialises the scores, written here from the definition: output, the
// log-sum-exp of every row, and dQ/dK/dV (autograd of the float64 one).
// Tolerances, relative to the reference's largest magnitude: fp32 2e-5 (fp32
// rounding of softmax sums over up to 64 keys), or, where larger, twice the
// error of the same materialised attention run in fp32, or twice |S|·2^-24
// (logits of hundreds: fp32's resolution of q·k itself then dominates every
// fp32 algorithm, and which one loses more depends on the BLAS kernels:
// measured 2026-12-02 at q scaled by 300, |S| = 1237, |S|·2^-24 = 7.4e-5, the
// tiled dK's error 6.4e-5 with OpenBLAS's Haswell kernels against 2.7e-5 for
// the materialised fp32 run; with its SkylakeX kernels under twice that);
// bf16 inputs 2e-2 (bf16 rounding of the output, 2^-8).
// Mutations, each made in nn/tiled_attention.cpp and seen to fail every case
// but the error test: mixed (diagonal) tiles left unmasked; the running sum and
// output not rescaled when the row maximum grows (alpha = 1).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/comm/comm.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/tiled_attention.h"

namespace meshtrain {
namespace {

using nn::AttentionMask;

struct Case {
  int64_t b = 2, hq = 4, hkv = 2, s = 37, t = 37, d = 16;
  AttentionMask mask;
  double q_scale = 1;  // > 1: logits far beyond exp's fp32 range
  double dropout = 0;
  uint64_t seed = 0;
};

// [b, s, t] true where query i may not see key j, from the mask's definition.
at::Tensor hidden(const Case& c) {
  const int64_t off = c.mask.q_offset < 0 ? c.t - c.s : c.mask.q_offset;
  at::Tensor pos = (at::arange(c.s, at::kLong) + off).view({1, c.s, 1});
  at::Tensor key = at::arange(c.t, at::kLong).view({1, 1, c.t});
  at::Tensor h = at::zeros({c.b, c.s, c.t}, at::kBool);
  if (c.mask.causal) h = h.logical_or(key > pos);
  if (c.mask.window > 0) h = h.logical_or(key <= pos - c.mask.window);
  if (c.mask.doc_ids.defined()) {
    at::Tensor dk = c.mask.doc_ids.view({c.b, 1, c.t});
    at::Tensor dq = c.mask.doc_ids.narrow(1, off, c.s).view({c.b, c.s, 1});
    h = h.logical_or(dq != dk).logical_or(dq < 0).logical_or(dk < 0);
  }
  return h;
}

// float64 attention with the scores materialised, its probabilities times
// `keep` (a dropout mask) when given. Returns out and lse.
std::pair<at::Tensor, at::Tensor> reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const Case& c, const at::Tensor& keep = {}) {
  const at::Tensor kk = k.repeat_interleave(c.hq / c.hkv, 1), vv = v.repeat_interleave(c.hq / c.hkv, 1);
  at::Tensor sc = at::matmul(q, kk.transpose(-1, -2)) / std::sqrt(static_cast<double>(c.d));
  sc = sc.masked_fill(hidden(c).unsqueeze(1), -INFINITY);
  const at::Tensor m = std::get<0>(sc.max(-1, true)).detach();
  const at::Tensor shift = m.masked_fill(m == -INFINITY, 0.0);
  const at::Tensor e = (sc - shift).exp();
  const at::Tensor l = e.sum(-1, true);
  const at::Tensor seen = l > 0;
  at::Tensor probs = e / at::where(seen, l, at::ones_like(l));
  if (keep.defined()) probs = probs * keep.to(probs.scalar_type());
  const at::Tensor out = at::matmul(probs, vv);
  const at::Tensor lse = (shift + l.log()).masked_fill(seen.logical_not(), -INFINITY).squeeze(-1);
  return {out, lse};
}

double rel_err(const at::Tensor& a, const at::Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  return (a.to(at::kDouble) - ref).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// Runs one case at the given tile sizes in `dtype`; checks out, lse and the gradients.
void check(const Case& c, int64_t bq, int64_t bk, at::ScalarType dtype = at::kFloat) {
  const double tol = dtype == at::kFloat ? 2e-5 : 2e-2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto opt = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q0 = at::randn({c.b, c.hq, c.s, c.d}, gen, opt) * c.q_scale;
  const at::Tensor k0 = at::randn({c.b, c.hkv, c.t, c.d}, gen, opt), v0 = at::randn({c.b, c.hkv, c.t, c.d}, gen, opt);
  const at::Tensor w = at::randn({c.b, c.hq, c.s, c.d}, gen, opt);  // d loss / d out
  // The inputs as the tiled op sees them, and the reference on exactly those values.
  const at::Tensor qx = q0.to(dtype), kx = k0.to(dtype), vx = v0.to(dtype);
  at::Tensor q = qx.to(at::kDouble).requires_grad_(), k = kx.to(at::kDouble).requires_grad_(),
             v = vx.to(at::kDouble).requires_grad_();
  const nn::TiledAttentionOptions o{bq, bk, c.dropout, c.seed};
  const at::Tensor keep = c.dropout > 0 ? nn::tiled_dropout_mask(c.b, c.hq, c.s, c.t, o) : at::Tensor();
  auto [ref_out, ref_lse] = reference(q, k, v, c, keep);
  (ref_out * w).sum().backward();

  // The same materialised attention in fp32: how much fp32 itself loses on this case.
  at::Tensor fq = qx.to(at::kFloat).requires_grad_(), fk = kx.to(at::kFloat).requires_grad_(),
             fv = vx.to(at::kFloat).requires_grad_();
  (reference(fq, fk, fv, c, keep).first * w.to(at::kFloat)).sum().backward();
  // fp32's resolution of the logits themselves: |S| 2^-24 (the largest score, from the float64 inputs).
  const double logits = (at::matmul(q, k.repeat_interleave(c.hq / c.hkv, 1).transpose(-1, -2)).abs().max() /
                         std::sqrt(static_cast<double>(c.d)))
                            .item<double>();
  const double resolution = logits * std::ldexp(1.0, -24);
  auto tol_for = [&](const at::Tensor& fp32, const at::Tensor& ref) {
    return dtype == at::kFloat ? std::max({tol, 2 * rel_err(fp32, ref), 2 * resolution}) : tol;
  };

  auto [out, lse] = nn::tiled_attention_forward(qx, kx, vx, c.mask, o);
  EXPECT_EQ(out.scalar_type(), dtype);
  const std::string where = "tiles " + std::to_string(bq) + "x" + std::to_string(bk);
  EXPECT_LE(rel_err(out, ref_out.detach()), tol) << where << " out";
  const at::Tensor finite = ref_lse.isfinite();
  EXPECT_TRUE(at::equal(lse.isfinite(), finite)) << where << ": the same rows see no key";
  EXPECT_LE(rel_err(lse.masked_select(finite), ref_lse.detach().masked_select(finite)), tol) << where << " lse";

  at::Tensor tq = qx.detach().requires_grad_(), tk = kx.detach().requires_grad_(), tv = vx.detach().requires_grad_();
  at::Tensor tout = nn::tiled_attention(tq, tk, tv, c.mask, o);
  (tout * w.to(dtype)).sum().backward();
  EXPECT_LE(rel_err(tq.grad(), q.grad()), tol_for(fq.grad(), q.grad())) << where << " dq";
  EXPECT_LE(rel_err(tk.grad(), k.grad()), tol_for(fk.grad(), k.grad())) << where << " dk (fp32 materialised "
                                                                         << rel_err(fk.grad(), k.grad())
                                                                         << ", |S| 2^-24 " << resolution << ")";
  EXPECT_LE(rel_err(tv.grad(), v.grad()), tol_for(fv.grad(), v.grad())) << where << " dv";
}

void check_tilings(const Case& c) {
  for (auto [bq, bk] : {std::pair<int64_t, int64_t>{8, 16}, {5, 7}, {64, 64}, {37, 1}, {1, 37}}) check(c, bq, bk);
}

TEST(TiledAttention, CausalAndNotOverTilesThatDoAndDoNotDivide) {
  Case c;
  check_tilings(c);
  c.mask.causal = false;
  check_tilings(c);
}

TEST(TiledAttention, GqaAndMqa) {
  Case c;
  c.hq = 6, c.hkv = 3;
  check_tilings(c);
  c.hkv = 1;
  check_tilings(c);
}

// model.attention = "sdpa" (at::scaled_dot_product_attention) computes the naive path's
// attention, values and gradients, fp32 within reassociation; GQA and MQA included.
TEST(SdpaAttention, EqualsNaiveAttentionWithGradients) {
  at::manual_seed(5);
  for (int64_t hkv : {4, 2, 1}) {
    const at::Tensor q0 = at::randn({2, 4, 48, 16}), k0 = at::randn({2, hkv, 48, 16}), v0 = at::randn({2, hkv, 48, 16});
    const at::Tensor dy = at::randn({2, 4, 48, 16});
    std::vector<at::Tensor> grads[2];
    at::Tensor out[2];
    for (int fused = 0; fused < 2; ++fused) {
      const at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
      out[fused] = fused ? nn::sdpa_causal_attention(q, k, v) : nn::causal_attention(q, k, v);
      (out[fused] * dy).sum().backward();
      grads[fused] = {q.grad(), k.grad(), v.grad()};
    }
    EXPECT_TRUE(at::allclose(out[1], out[0], 1e-5, 1e-5)) << hkv << ": " << (out[1] - out[0]).abs().max();
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 1e-4, 1e-5)) << hkv << " grad " << i;
    }
  }
}

// Packed documents (one-token documents among them) and padding (id -1: rows
// that see no key: output 0, lse -inf, no gradient).
TEST(TiledAttention, DocumentMasksAndFullyMaskedRows) {
  Case c;
  at::Tensor ids = at::zeros({c.b, c.t}, at::kLong);
  ids[0].narrow(0, 0, 10).fill_(0), ids[0].narrow(0, 10, 1).fill_(1), ids[0].narrow(0, 11, 20).fill_(2);
  ids[0].narrow(0, 31, 1).fill_(3), ids[0].narrow(0, 32, 5).fill_(-1);
  ids[1].copy_(at::arange(c.t, at::kLong).floor_divide(3));  // many short documents
  c.mask.doc_ids = ids;
  check_tilings(c);
  c.mask.causal = false;
  check_tilings(c);
}

// Attention dropout: the op equals the materialised attention whose
// probabilities are multiplied by the op's own keep mask (tiled_dropout_mask),
// forward and backward; the mask drops about p of the entries, depends on the
// key and not on the tile sizes (nn/keyed_dropout.h). Mutation seen to fail (dQ, dK at every tiling): backward not
// applying the mask to dP.
TEST(TiledAttention, DropoutEqualsTheSameMaskMaterialised) {
  Case c;
  c.dropout = 0.3;
  c.seed = 77;
  check_tilings(c);
  c.hq = 6, c.hkv = 3;
  check_tilings(c);
  const nn::TiledAttentionOptions o{8, 16, 0.3, 77};
  const at::Tensor z = nn::tiled_dropout_mask(2, 4, 64, 64, o);
  EXPECT_NEAR((z == 0).to(at::kDouble).mean().item<double>(), 0.3, 0.02);
  EXPECT_TRUE(at::equal(z, nn::tiled_dropout_mask(2, 4, 64, 64, o)));
  EXPECT_FALSE(at::equal(z, nn::tiled_dropout_mask(2, 4, 64, 64, {8, 16, 0.3, 78})));
  EXPECT_TRUE(at::equal(z, nn::tiled_dropout_mask(2, 4, 64, 64, {64, 32, 0.3, 77})));
}

TEST(TiledAttention, SlidingWindowAndDecodingOffset) {
  Case c;
  c.mask.window = 5;
  check_tilings(c);
  Case dec;
  dec.s = 5, dec.t = 23;  // the last 5 positions of 23 keys
  check_tilings(dec);
}

// Logits of hundreds: exp overflows fp32 without the running maximum.
TEST(TiledAttention, LargeLogitsDoNotOverflow) {
  Case c;
  c.q_scale = 300;
  check(c, 8, 16);
  at::Tensor q = at::full({1, 1, 4, 8}, 100.0), k = at::full({1, 1, 4, 8}, 100.0), v = at::ones({1, 1, 4, 8});
  at::Tensor out = nn::tiled_attention(q, k, v);
  EXPECT_TRUE(out.isfinite().all().item<bool>());
  EXPECT_TRUE(at::allclose(out, v));
}

TEST(TiledAttention, Bf16InputsAccumulateInFp32) {
  Case c;
  check(c, 8, 16, at::kBFloat16);
}

TEST(TiledAttention, BadShapesAreClearErrors) {
  at::Tensor q = at::zeros({1, 3, 4, 8}), k = at::zeros({1, 2, 4, 8});
  try {
    nn::tiled_attention(q, k, k);
    ADD_FAILURE() << "3 query heads on 2 kv heads accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("heads a multiple of kv heads"), std::string::npos) << e.what();
  }
  AttentionMask m;
  m.doc_ids = at::zeros({1, 3}, at::kLong);
  try {
    nn::tiled_attention(at::zeros({1, 2, 4, 8}), k, k, m);
    ADD_FAILURE() << "doc_ids of the wrong length accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("doc_ids must be [batch, keys] = [1, 4]"), std::string::npos) << e.what();
  }
}

// With attention dropout, selective recomputation (the attention core re-run
// in backward) gives the gradients of no recomputation bitwise: the core's masks
// are keyed by what it captured in forward.
TEST(TiledAttention, ModelDropoutIsReplayedByRecomputation) {
  plan::ModelSpec spec = plan::preset("gpt-tiny");
  spec.layers = 2, spec.vocab = 100, spec.seq = 40, spec.dropout = 0.2;
  spec.attention = plan::AttentionImpl::Tiled;
  Comm solo("solo", 0);
  Transformer plain(spec, solo, false, 3), recomputed(spec, solo, false, 3);
  recomputed.set_recompute(nn::Recompute::Selective);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor tokens = at::randint(spec.vocab, {2, spec.seq}, gen, at::kLong);
  const at::Tensor la = plain.forward(tokens, tokens).sum(), lb = recomputed.forward(tokens, tokens).sum();
  la.backward();
  lb.backward();
  EXPECT_EQ(la.item<double>(), lb.item<double>());
  for (size_t i = 0; i < plain.params().params().size(); ++i) {
    EXPECT_TRUE(at::equal(plain.params().params()[i].tensor.grad(), recomputed.params().params()[i].tensor.grad()))
        << plain.params().params()[i].name;
  }
  // Dropout is on: the same step drops the same, the next step other elements.
  EXPECT_EQ(plain.forward(tokens, tokens).sum().item<double>(), la.item<double>());
  plain.set_dropout_step(1);
  EXPECT_NE(plain.forward(tokens, tokens).sum().item<double>(), la.item<double>());
}

// model.attention = "auto" (the default): the materialised scores below four
// tiles of keys, the tiled kernel from there (bitwise the explicit choice's
// per-token losses each side, which differ from each other by rounding).
// Auto (plan/spec.h): sdpa without dropout at any length; with attention dropout (which sdpa
// does not take) naive below four tiles of keys and tiled from there.
TEST(TiledAttention, AutoIsSdpaWithoutDropoutElseNaiveBelowFourTilesAndTiledFromThere) {
  plan::ModelSpec spec = plan::preset("gpt-tiny");
  ASSERT_EQ(spec.attention, plan::AttentionImpl::Auto);
  spec.layers = 1, spec.vocab = 64;
  Comm solo("solo", 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  for (double dropout : {0.0, 0.1}) {
    for (int64_t seq : {plan::kAutoTiledKeys - 8, plan::kAutoTiledKeys}) {
      spec.seq = seq;
      spec.dropout = dropout;
      const at::Tensor tokens = at::randint(spec.vocab, {1, seq}, gen, at::kLong);
      std::map<plan::AttentionImpl, at::Tensor> loss;  // per token
      auto kernels = {plan::AttentionImpl::Auto, plan::AttentionImpl::Naive, plan::AttentionImpl::Tiled};
      for (auto a : kernels) {
        spec.attention = a;
        Transformer m(spec, solo, false, 4);
        loss[a] = m.forward(tokens, tokens, /*train=*/true).detach();
      }
      if (dropout == 0) {
        spec.attention = plan::AttentionImpl::Sdpa;
        Transformer m(spec, solo, false, 4);
        loss[spec.attention] = m.forward(tokens, tokens, true).detach();
      }
      const auto want = dropout == 0                  ? plan::AttentionImpl::Sdpa
                        : seq >= plan::kAutoTiledKeys ? plan::AttentionImpl::Tiled
                                                      : plan::AttentionImpl::Naive;
      const std::string what = fmt::format("seq {}, dropout {}", seq, dropout);
      EXPECT_TRUE(at::equal(loss[plan::AttentionImpl::Auto], loss[want])) << what;
      for (auto other : kernels) {
        if (other == want || other == plan::AttentionImpl::Auto) continue;
        EXPECT_FALSE(at::equal(loss[other], loss[want]))
            << what << ": two kernels round alike, the test cannot tell which one auto took";
      }
    }
  }
}

// Packed documents (train.document_mask): a sequence of three documents gives,
// at every position, the loss each document gives alone (positions restarting,
// no attention across documents), and the gradient of their sum; for learned
// positions and RoPE, with and without full recomputation.
TEST(TiledAttention, PackedDocumentsEqualDocumentsAlone) {
  for (const char* preset : {"llama-tiny", "gpt-tiny"}) {
    for (bool recompute : {false, true}) {
      plan::ModelSpec spec = plan::preset(preset);
      spec.layers = 2, spec.vocab = 100, spec.seq = 48, spec.dropout = 0;
      spec.attention = plan::AttentionImpl::Tiled;
      Comm solo("solo", 0);
      Transformer packed(spec, solo, false, 3), alone(spec, solo, false, 3);
      if (recompute) packed.set_recompute(nn::Recompute::Full);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
      const at::Tensor tokens = at::randint(spec.vocab, {1, spec.seq}, gen, at::kLong);
      const at::Tensor targets = at::randint(spec.vocab, {1, spec.seq}, gen, at::kLong);
      const int64_t lens[] = {17, 1, 30};  // a one-token document among them
      at::Tensor docs = at::empty({1, spec.seq}, at::kLong);
      std::vector<at::Tensor> losses;
      for (int64_t i = 0, start = 0; i < 3; start += lens[i], ++i) {
        docs.narrow(1, start, lens[i]).fill_(i);
        losses.push_back(alone.forward(tokens.narrow(1, start, lens[i]), targets.narrow(1, start, lens[i])));
      }
      const at::Tensor want = at::cat(losses, 0);
      want.sum().backward();
      const at::Tensor got = packed.forward(tokens, targets, true, docs);
      got.sum().backward();
      const std::string what = std::string(preset) + (recompute ? " recompute" : "");
      EXPECT_LE(rel_err(got.detach(), want.detach().to(at::kDouble)), 1e-5) << what;
      // Against the largest gradient of all (the key bias's is rounding noise: see the next test).
      double scale = 0;
      for (const auto& p : alone.params().params()) scale = std::max(scale, p.tensor.grad().abs().max().item<double>());
      for (size_t i = 0; i < packed.params().params().size(); ++i) {
        const at::Tensor ga = packed.params().params()[i].tensor.grad(), gb = alone.params().params()[i].tensor.grad();
        EXPECT_LE((ga - gb).abs().max().item<double>(), 1e-5 * scale) << what << " " << packed.params().params()[i].name;
      }
    }
  }
}

// model.attention = "tiled" computes what "naive" computes: the loss and every
// gradient (2 layers, sequence 80: a full and a partial tile), and generation
// with a KV cache (queries after the cached keys).
TEST(TiledAttention, ModelWithTiledAttentionMatchesNaive) {
  for (const char* preset : {"llama-tiny", "gpt-tiny"}) {
    plan::ModelSpec spec = plan::preset(preset);
    spec.layers = 2, spec.vocab = 100, spec.seq = 80, spec.dropout = 0;
    plan::ModelSpec tiled_spec = spec;
    tiled_spec.attention = plan::AttentionImpl::Tiled;
    Comm solo("solo", 0);
    Transformer naive(spec, solo, false, 3), tiled(tiled_spec, solo, false, 3);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const at::Tensor tokens = at::randint(spec.vocab, {2, spec.seq}, gen, at::kLong);
    const at::Tensor targets = at::randint(spec.vocab, {2, spec.seq}, gen, at::kLong);
    const at::Tensor la = naive.forward(tokens, targets).sum(), lb = tiled.forward(tokens, targets).sum();
    la.backward();
    lb.backward();
    EXPECT_NEAR(lb.item<double>(), la.item<double>(), 1e-5 * la.item<double>()) << preset;
    // Gradients against the largest of all: the key bias's gradient is zero in
    // exact arithmetic (a shift of every score of a row leaves softmax unchanged),
    // so both runs hold rounding noise there, which no relative bound can compare.
    const auto& pa = naive.params().params();
    const auto& pb = tiled.params().params();
    double scale = 0;
    for (const auto& p : pa) scale = std::max(scale, p.tensor.grad().abs().max().item<double>());
    for (size_t i = 0; i < pa.size(); ++i) {
      const double err = (pb[i].tensor.grad() - pa[i].tensor.grad()).abs().max().item<double>();
      EXPECT_LE(err, 1e-5 * scale) << preset << " " << pa[i].name;
    }
    KVCache ca, cb;
    const at::Tensor prompt = tokens.narrow(1, 0, 10);
    EXPECT_LE(rel_err(tiled.decode(prompt, cb), naive.decode(prompt, ca).to(at::kDouble)), 1e-5) << preset;
    for (int64_t i = 10; i < 13; ++i) {
      const at::Tensor next = tokens.narrow(1, i, 1);
      EXPECT_LE(rel_err(tiled.decode(next, cb), naive.decode(next, ca).to(at::kDouble)), 1e-5) << preset << " token " << i;
    }
  }
}

}  // namespace
}  // namespace meshtrain
