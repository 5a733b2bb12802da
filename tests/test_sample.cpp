// Generation: the KV-cache path gives the logits of a full forward pass, and
// temperature / top-k / top-p select what they promise.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/sampler.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {
namespace {

// fp32: the cached path sums the same products in another blocking, so
// logits agree to rounding: |a - b| <= 1e-4 * max|a| + 1e-6.
void expect_close(const at::Tensor& a, const at::Tensor& b) {
  const double tol = 1e-4 * a.abs().max().item<double>() + 1e-6;
  EXPECT_LE((a - b).abs().max().item<double>(), tol);
}

TEST(Sample, CachedDecodingEqualsFullForward) {
  for (const char* name : {"gpt-tiny", "llama-tiny"}) {  // learned positions + MHA; RoPE + GQA
    SCOPED_TRACE(name);
    plan::ModelSpec spec = plan::preset(name);
    spec.layers = 2;
    spec.dropout = 0;
    Comm solo("tp", 0);
    Transformer model(spec, solo, false, 3);
    at::NoGradGuard no_grad;
    at::Tensor tokens = at::randint(0, spec.vocab, {2, 12}, at::kLong);
    at::Tensor full = model.logits(tokens);  // [12, 2, V]
    // The buffer sized for the model's sequence (capacity 0), for the generation
    // (12), and too short (7: it doubles once, keeping the past).
    for (int64_t capacity : {0, 12, 7}) {
      SCOPED_TRACE(capacity);
      KVCache cache;
      cache.capacity = capacity;
      at::Tensor prompt = model.decode(tokens.narrow(1, 0, 5), cache);
      expect_close(full.narrow(0, 0, 5), prompt);
      for (int64_t t = 5; t < 12; ++t) {
        at::Tensor one = model.decode(tokens.narrow(1, t, 1), cache);
        expect_close(full.narrow(0, t, 1), one);
      }
      EXPECT_EQ(cache.length, 12);
      EXPECT_EQ(cache.k[0].size(2), capacity == 0 ? spec.seq : capacity == 7 ? 14 : 12);
    }
  }
}

TEST(Sample, GreedyGenerationFollowsTheArgmax) {
  plan::ModelSpec spec = plan::preset("llama-tiny");
  spec.layers = 2;
  Comm solo("tp", 0);
  Transformer model(spec, solo, false, 5);
  SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 6;
  const std::vector<int64_t> prompt{1, 2, 3};
  const auto out = generate(model, prompt, o);
  ASSERT_EQ(out.size(), 6u);
  at::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt;
  for (int64_t expected : out) {
    at::Tensor l = model.logits(at::tensor(seq, at::kLong).view({1, -1}));
    EXPECT_EQ(l[-1][0].narrow(0, 0, spec.vocab).argmax().item<int64_t>(), expected);
    seq.push_back(expected);
  }
  o.max_new_tokens = spec.seq;  // no room left after the prompt
  EXPECT_THROW(generate(model, prompt, o), std::invalid_argument);
}

TEST(Sample, TemperatureTopKTopP) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // p = (0.5, 0.3, 0.15, 0.05)
  at::Tensor logits = at::log(at::tensor({0.5f, 0.3f, 0.15f, 0.05f}));
  SampleOptions o;
  o.temperature = 0;
  EXPECT_EQ(sample_token(logits, o, gen), 0);
  o.temperature = 1;
  o.top_k = 1;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, o, gen), 0);
  o.top_k = 2;
  std::vector<int> count(4, 0);
  for (int i = 0; i < 4000; ++i) ++count[sample_token(logits, o, gen)];
  EXPECT_EQ(count[2] + count[3], 0);
  EXPECT_NEAR(count[0] / 4000.0, 0.5 / 0.8, 0.03);  // renormalised over the top 2
  // top-p 0.7: tokens 0 and 1 (mass before token 2 is 0.8 >= 0.7).
  o.top_k = 0;
  o.top_p = 0.7;
  count.assign(4, 0);
  for (int i = 0; i < 4000; ++i) ++count[sample_token(logits, o, gen)];
  EXPECT_EQ(count[2] + count[3], 0);
  EXPECT_GT(count[1], 0);
  o.top_p = 0.01;  // the most likely token always stays
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, o, gen), 0);
  // Temperature 1, no limits: the frequencies are the probabilities.
  o.top_p = 1;
  count.assign(4, 0);
  for (int i = 0; i < 8000; ++i) ++count[sample_token(logits, o, gen)];
  EXPECT_NEAR(count[0] / 8000.0, 0.5, 0.03);
  EXPECT_NEAR(count[3] / 8000.0, 0.05, 0.015);
  o.top_p = 1.5;
  EXPECT_THROW(validate(o), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
