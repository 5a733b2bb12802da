// LoRA (peft/lora.h) in one process: a fresh adapter (B = 0) leaves the model's
// outputs bitwise unchanged; merged weights give the adapter's outputs (fp32
// tolerance 1e-5 relative: W + s·BA rounds once more); unmerge restores W;
// disabled adapters give the base; only adapters train; bad options are errors.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/adapter.h"
#include "meshtrain/peft/lora.h"

namespace meshtrain {
namespace {

plan::ModelSpec spec(const char* preset) {
  plan::ModelSpec m = plan::preset(preset);
  m.layers = 2, m.vocab = 100, m.seq = 24, m.dropout = 0;
  return m;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Gives every B random values, so that the adapters change the outputs.
void randomise_b(Transformer& m) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  at::NoGradGuard no_grad;
  for (auto& p : m.params().params()) {
    if (p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".lora_b") == 0) {
      p.tensor.copy_(at::randn(p.tensor.sizes(), gen) * 0.05);
    }
  }
}

TEST(Lora, FreshAdaptersLeaveTheModelUnchangedAndOnlyThemTrain) {
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    Comm solo("solo", 0);
    Transformer base(spec(preset), solo, false, 5), adapted(spec(preset), solo, false, 5);
    LoraOptions o;
    o.targets = {"all"};
    const auto names = apply_lora(adapted, o);
    EXPECT_EQ(names.size(), 2u * (std::string(preset) == "gpt-tiny" ? 6 : 7)) << preset;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    const at::Tensor tokens = at::randint(100, {2, 24}, gen, at::kLong);
    const at::Tensor lb = base.forward(tokens, tokens), la = adapted.forward(tokens, tokens);
    EXPECT_TRUE(at::equal(la, lb)) << preset << ": B = 0 must add exactly nothing";
    la.sum().backward();
    for (const auto& p : adapted.params().params()) {
      const bool adapter = p.name.find(".lora_") != std::string::npos;
      EXPECT_EQ(p.frozen, !adapter) << p.name;
      EXPECT_EQ(p.tensor.grad().defined(), adapter) << p.name;
    }
  }
}

TEST(Lora, MergeUnmergeAndDisable) {
  Comm solo("solo", 0);
  Transformer base(spec("llama-tiny"), solo, false, 5), m(spec("llama-tiny"), solo, false, 5);
  LoraOptions o;
  o.targets = {"attn.q", "attn.v", "mlp.down"};
  o.rank = 4;
  apply_lora(m, o);
  randomise_b(m);
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(100, {2, 24}, gen, at::kLong);
  const at::Tensor with = m.logits(tokens), without = base.logits(tokens);
  EXPECT_GT(rel(with, without), 1e-3);  // the adapters matter
  const at::Tensor w0 = m.params().find("layers.1.mlp.down.weight").tensor.clone();
  merge_lora(m);
  EXPECT_LE(rel(m.logits(tokens), with), 1e-5);
  merge_lora(m);  // already merged: nothing added twice
  EXPECT_LE(rel(m.logits(tokens), with), 1e-5);
  unmerge_lora(m);
  EXPECT_LE(rel(m.params().find("layers.1.mlp.down.weight").tensor, w0), 1e-6);
  EXPECT_LE(rel(m.logits(tokens), with), 1e-5);
  enable_lora(m, false);
  EXPECT_LE(rel(m.logits(tokens), without), 1e-6);
  enable_lora(m, true);
  EXPECT_LE(rel(m.logits(tokens), with), 1e-6);
}

// Houlsby adapters (peft/adapter.h): up = 0 leaves the model bitwise unchanged,
// only the adapters get gradients, and once trained they change the outputs.
TEST(Adapters, FreshAdaptersAreNeutralAndOnlyThemTrain) {
  Comm solo("solo", 0);
  Transformer base(spec("gpt-tiny"), solo, false, 5), adapted(spec("gpt-tiny"), solo, false, 5);
  EXPECT_EQ(apply_adapters(adapted, AdapterOptions{8}), 4);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(100, {2, 24}, gen, at::kLong);
  const at::Tensor la = adapted.forward(tokens, tokens);
  EXPECT_TRUE(at::equal(la, base.forward(tokens, tokens)));
  la.sum().backward();
  for (const auto& p : adapted.params().params()) {
    const bool adapter = p.name.find(".adapter_") != std::string::npos;
    EXPECT_EQ(p.tensor.grad().defined(), adapter) << p.name;
    EXPECT_EQ(p.frozen, !adapter) << p.name;
  }
  EXPECT_GT(adapted.params().find("layers.1.adapter_mlp.up.weight").tensor.grad().abs().max().item<double>(), 0);
  EXPECT_THROW(apply_adapters(base, AdapterOptions{0}), std::invalid_argument);
}

TEST(Lora, BadOptionsAreClearErrors) {
  Comm solo("solo", 0);
  Transformer m(spec("gpt-tiny"), solo, false, 5);
  LoraOptions o;
  o.targets = {"attn.qq"};
  try {
    apply_lora(m, o);
    ADD_FAILURE() << "no target matched, yet no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no linear matches the targets attn.qq"), std::string::npos) << e.what();
  }
  o.targets = {"attn.q"};
  o.rank = 0;
  EXPECT_THROW(apply_lora(m, o), std::invalid_argument);
  // The launching process's check knows the same names as the model.
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    Transformer t(spec(preset), solo, false, 5);
    std::vector<std::string> names;
    const auto lin = t.linears();
    for (const auto& [n, l] : lin.column) names.push_back(n);
    for (const auto& [n, l] : lin.row) names.push_back(n);
    std::vector<std::string> want = linear_names(spec(preset));
    std::sort(names.begin(), names.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(names, want) << preset;
  }
  LoraOptions bad;
  bad.targets = {"attn.qq"};
  EXPECT_THROW(check_lora(spec("gpt-tiny"), bad), std::invalid_argument);
  bad.targets = {"mlp.gate"};  // SwiGLU only
  EXPECT_THROW(check_lora(spec("gpt-tiny"), bad), std::invalid_argument);
  EXPECT_NO_THROW(check_lora(spec("llama-tiny"), bad));
}

}  // namespace
}  // namespace meshtrain
