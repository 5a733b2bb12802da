// NF4 and QLoRA (peft/nf4.h, peft/qlora.h): the code table is the published
// one; every value gets its nearest code and the per-block error stays within
// absmax · (largest code gap) / 2; double quantisation reproduces the block
// scales within int8 error and stores 4 + 8/64 + 32/(64·256) bits per
// parameter; the nibbles unpack to the indices; and a quantised LoRA model
// computes the loss and adapter gradients of the same LoRA model on the
// dequantised weights, without holding the fp32 weights.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "meshtrain/comm/comm.h"
#include "tests/tiny_model.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/peft/qlora.h"

namespace meshtrain {
namespace {

TEST(Nf4, CodeTableIsThePublishedOne) {
  // QLoRA Appendix E / bitsandbytes get_4bit_type("nf4"), digit for digit.
  const float published[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                               -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                               0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                               0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                               0.7229568362236023f, 1.0f};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kNf4Code[i], published[i]) << i;
}

double max_gap() {
  double g = 0;
  for (int i = 0; i < 15; ++i) g = std::max(g, static_cast<double>(kNf4Code[i + 1] - kNf4Code[i]));
  return g;
}

TEST(Nf4, NearestCodesAndTheBlockErrorBound) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor w = at::randn({37, 50}, gen) * 0.02;  // 1850 values: the last block is partial
  const Nf4Tensor q = nf4_quantize(w, 64, false);
  EXPECT_EQ(q.blocks(), 29);
  const at::Tensor idx = nf4_indices(q).to(at::kLong);
  const at::Tensor flat = w.reshape({-1});
  const at::Tensor scale = nf4_scales(q).repeat_interleave(64).narrow(0, 0, flat.numel());
  const at::Tensor normed = flat / scale;
  const at::Tensor code = at::tensor(std::vector<float>(kNf4Code.begin(), kNf4Code.end()));
  // Nearest: no code is closer than the chosen one.
  const at::Tensor chosen = (normed - code.index_select(0, idx)).abs();
  const at::Tensor best = (normed.unsqueeze(1) - code.unsqueeze(0)).abs().amin(1);
  EXPECT_LE((chosen - best).max().item<double>(), 1e-7);
  // Round trip within absmax · max_gap / 2 per block.
  const at::Tensor err = (nf4_dequantize(q, at::kFloat).reshape({-1}) - flat).abs();
  EXPECT_TRUE(at::all(err <= scale * (max_gap() / 2) + 1e-9).item<bool>()) << (err / scale).max().item<double>();
  EXPECT_NEAR(max_gap() / 2, 0.152, 1e-3);
  // The largest value of a block is exact (code ±1).
  EXPECT_EQ(nf4_dequantize(q, at::kFloat).reshape({-1})[flat.abs().argmax()].item<float>(),
            flat[flat.abs().argmax()].item<float>());
  EXPECT_THROW(nf4_quantize(w, 63), std::invalid_argument);
}

TEST(Nf4, DoubleQuantisationBitsAndScales) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor w = at::randn({768, 3072}, gen) * 0.02;  // a GPT-2 small MLP weight
  const Nf4Tensor plain = nf4_quantize(w, 64, false), dq = nf4_quantize(w, 64, true);
  EXPECT_TRUE(at::equal(plain.packed, dq.packed)) << "the codes do not depend on how the scales are stored";
  const double n = static_cast<double>(w.numel());
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(plain.bytes()) / n, 4.5);
  const double bits = 8.0 * static_cast<double>(dq.bytes()) / n;
  EXPECT_DOUBLE_EQ(bits, 4 + 8.0 / 64 + 32.0 / (64 * 256) + 32.0 / n);  // + one fp32 offset per tensor
  EXPECT_NEAR(bits, 4.127, 5e-4);
  // Each scale within half an int8 step of its group's range.
  const at::Tensor step = dq.scale2.repeat_interleave(256).narrow(0, 0, dq.blocks()) / 127;
  EXPECT_TRUE(at::all((nf4_scales(dq) - plain.absmax).abs() <= step / 2 + 1e-9).item<bool>());
  // And the round trip within the bound with the scales it used, plus their error.
  const at::Tensor err = (nf4_dequantize(dq, at::kFloat) - w).abs().reshape({-1, 64}).amax(1);
  EXPECT_TRUE(at::all(err <= nf4_scales(dq) * (max_gap() / 2) + step / 2 + 1e-9).item<bool>());
}

plan::ModelSpec spec() { return test::tiny_llama(96, 16); }

TEST(Qlora, MatchesLoraOnTheDequantisedWeights) {
  Comm solo("solo", 0);
  Transformer q(spec(), solo, false, 3), ref(spec(), solo, false, 3);
  LoraOptions o;
  o.targets = {"all"};
  apply_lora(q, o);
  apply_lora(ref, o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < q.params().params().size(); ++i) {
      auto& p = q.params().params()[i];
      if (p.name.find(".lora_b") == std::string::npos) continue;
      p.tensor.copy_(at::randn(p.tensor.sizes(), gen) * 0.05);
      ref.params().params()[i].tensor.copy_(p.tensor);
    }
  }
  int64_t fp32_bytes = 0;
  for (auto& [name, l] : q.linears().column) fp32_bytes += l->weight.numel() * 4;
  for (auto& [name, l] : q.linears().row) fp32_bytes += l->weight.numel() * 4;
  const size_t before = q.params().params().size();
  const int64_t bytes = quantize_base(q, {});
  EXPECT_EQ(bytes, quantized_bytes(q));
  EXPECT_LT(static_cast<double>(bytes) / static_cast<double>(fp32_bytes), 4.2 / 32);
  EXPECT_EQ(q.params().params().size(), before - q.linears().column.size() - q.linears().row.size());
  {
    // The reference holds exactly the dequantised weights.
    at::NoGradGuard no_grad;
    auto ql = q.linears(), rl = ref.linears();
    for (size_t i = 0; i < ql.column.size(); ++i) {
      EXPECT_FALSE(ql.column[i].second->weight.defined());
      rl.column[i].second->weight.copy_(nf4_dequantize(dynamic_cast<const Nf4Weight&>(*ql.column[i].second->packed).tensor, at::kFloat));
    }
    for (size_t i = 0; i < ql.row.size(); ++i) rl.row[i].second->weight.copy_(nf4_dequantize(dynamic_cast<const Nf4Weight&>(*ql.row[i].second->packed).tensor, at::kFloat));
  }
  const at::Tensor tokens = at::randint(96, {2, 16}, gen, at::kLong), targets = at::randint(96, {2, 16}, gen, at::kLong);
  const at::Tensor lq = q.forward(tokens, targets).mean(), lr = ref.forward(tokens, targets).mean();
  lq.backward();
  lr.backward();
  EXPECT_NEAR(lq.item<double>(), lr.item<double>(), 1e-6 * lr.item<double>());
  int compared = 0;
  for (const auto& p : q.params().params()) {
    if (p.frozen) {
      EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
      continue;
    }
    const at::Tensor g = ref.params().find(p.name).tensor.grad();
    EXPECT_TRUE(at::allclose(p.tensor.grad(), g, 1e-4, 1e-7)) << p.name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 * static_cast<int>(q.linears().column.size() + q.linears().row.size()));
  EXPECT_THROW(quantize_base(q, {}), std::invalid_argument);  // already quantised
  EXPECT_THROW(merge_lora(q), std::invalid_argument);
  Transformer bare(spec(), solo, false, 3);
  EXPECT_THROW(quantize_base(bare, {}), std::invalid_argument);  // nothing would train
}

}  // namespace
}  // namespace meshtrain
