// Tensor and sequence parallelism against the single-process model: with tp =
// the world size, the loss and every parameter's gradient (shards gathered)
// equal those of the same model built with tp = 1 from the same seed.
//
// Tolerance (fp32): |tp - single| <= 1e-4 * max|single| + 1e-7 per tensor. The
// two runs differ only in summation order (row-parallel partial sums are added
// across ranks), which perturbs results by a few ulps times sqrt(fan-in).
// With dropout the masks are keyed, not drawn, so they match one process too.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/tensor/fused_cross_entropy.h"
#include "meshtrain/peft/adapter.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/plan/count.h"
#include "tests/mp.h"
#include "meshtrain/rl/rollout.h"
#include "tests/parity.h"

namespace meshtrain::test {
namespace {

plan::ModelSpec tiny(bool llama, bool gqa, bool tied) {
  plan::ModelSpec m = plan::preset(llama ? "llama-tiny" : "gpt-tiny");
  m.name = "tp-test";
  m.vocab = 100;  // not a multiple of 128 x tp: padding is exercised
  m.seq = 16;
  m.layers = 2;
  m.hidden = 64;
  m.heads = 8;
  m.kv_heads = gqa ? 4 : 8;
  m.ffn = 96;
  m.tied = tied;
  m.dropout = 0.0;
  return m;
}

using Batch = TokenBatch;
Batch batch(const plan::ModelSpec& m) { return random_batch(m, 0, 3); }

at::Tensor full(const Param& p, Comm& tp) {
  return p.tp_dim >= 0 ? gather_along(p.tensor.detach(), tp, p.tp_dim) : p.tensor.detach();
}

// The one-process model computes attention naively; the parallel one with `attention`.
void check_parity(const plan::ModelSpec& spec, bool sp, plan::AttentionImpl attention = plan::AttentionImpl::Naive) {
  Comm& tp = runtime().world();
  Comm solo("solo", runtime().rank());
  const std::string what = fmt::format("{} gqa={} tied={} sp={} tp={} attention={}",
                                       spec.activation == plan::Activation::SwiGLU ? "llama" : "gpt",
                                       spec.kv_heads < spec.heads, spec.tied, sp, tp.size(),
                                       plan::attention_name(attention));
  plan::ModelSpec parallel_spec = spec;
  parallel_spec.attention = attention;
  Transformer single(spec, solo, false, 1234);
  Transformer parallel(parallel_spec, tp, sp, 1234);
  Batch b = batch(spec);

  at::Tensor ref = single.forward(b.tokens, b.targets).sum() / b.count;
  ref.backward();
  at::Tensor loss = parallel.forward(b.tokens, b.targets).sum() / b.count;
  loss.backward();
  parallel.finalize_grads();

  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>())) << what;
  const auto& ps = parallel.params().params();
  const auto& rs = single.params().params();
  ASSERT_EQ(ps.size(), rs.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(ps[i].name, rs[i].name);
    // Initialisation is independent of tp: the shards reassemble the same tensor.
    at::Tensor w = full(ps[i], tp), w_ref = rs[i].tensor.detach();
    at::Tensor w_cmp = ps[i].name == "embed.weight" || ps[i].name == "head.weight"
                           ? w.narrow(0, 0, spec.vocab) : w;
    at::Tensor w_ref_cmp = ps[i].name == "embed.weight" || ps[i].name == "head.weight"
                               ? w_ref.narrow(0, 0, spec.vocab) : w_ref;
    EXPECT_TRUE(w_cmp.equal(w_ref_cmp)) << what << " " << ps[i].name << ": initial weights differ";
    at::Tensor g = ps[i].tensor.grad(), g_ref = rs[i].tensor.grad();
    ASSERT_TRUE(g.defined()) << what << " " << ps[i].name;
    expect_grad_parity(ps[i].tp_dim >= 0 ? gather_along(g, tp, ps[i].tp_dim) : g, g_ref, ps[i].name, spec.vocab,
                       what);
  }
}

TEST(TensorParallel, EveryCombinationMatchesOneProcess) {
  if (8 % runtime().world_size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool llama : {true, false})
    for (bool gqa : {false, true})
      for (bool tied : {true, false})
        for (bool sp : {false, true}) check_parity(tiny(llama, gqa, tied), sp);
}

// Tiled attention (nn/tiled_attention.h) on each rank's heads, against the
// one-process model with naive attention, with the same tolerances.
TEST(TensorParallel, TiledAttentionMatchesOneProcess) {
  if (8 % runtime().world_size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool llama : {true, false})
    for (bool sp : {false, true}) check_parity(tiny(llama, true, !llama), sp, plan::AttentionImpl::Tiled);
}

// Sets every parameter whose name contains `a` (and `b`, when given) to the
// same random full tensor in both models, sliced for `parallel`'s tp rank.
void set_same_random(Transformer& single, Transformer& parallel, Comm& tp, const std::string& a,
                     const std::string& b = "") {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < single.params().params().size(); ++i) {
    Param& s = single.params().params()[i];
    Param& p = parallel.params().params()[i];
    if (s.name.find(a) == std::string::npos || s.name.find(b) == std::string::npos) continue;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(stable_hash(s.name));
    const at::Tensor full = at::randn(s.tensor.sizes(), gen) * 0.05;
    s.tensor.copy_(full);
    p.tensor.copy_(p.tp_dim >= 0 ? full.chunk(tp.size(), p.tp_dim)[tp.rank()] : full);
  }
}

// One batch through both models: the loss (1e-5 relative) and the gradient of
// every parameter whose name contains `marker` (expect_grad_parity: shards
// gathered, tp-partial ones summed by finalize_grads) equal; every other
// parameter is frozen and has none. Returns how many parameters were compared.
int check_adapter_parity(Transformer& single, Transformer& parallel, Comm& tp, const plan::ModelSpec& spec,
                         const std::string& marker, const std::string& what) {
  Batch bt = batch(spec);
  at::Tensor ref = single.forward(bt.tokens, bt.targets).sum() / bt.count;
  ref.backward();
  at::Tensor loss = parallel.forward(bt.tokens, bt.targets).sum() / bt.count;
  loss.backward();
  parallel.finalize_grads();
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>())) << what;
  int compared = 0;
  for (size_t i = 0; i < single.params().params().size(); ++i) {
    const Param& a = single.params().params()[i];
    const Param& b = parallel.params().params()[i];
    EXPECT_EQ(a.name, b.name);
    if (a.name.find(marker) == std::string::npos) {
      EXPECT_FALSE(b.tensor.grad().defined()) << what << " " << b.name << " is frozen";
      continue;
    }
    ++compared;
    expect_grad_parity(b.tp_dim >= 0 ? gather_along(b.tensor.grad(), tp, b.tp_dim) : b.tensor.grad(), a.tensor.grad(),
                       a.name, spec.vocab, what);
  }
  return compared;
}

// LoRA under tp (peft/lora.h): adapters cut like their base linears give the
// one-process loss and adapter gradients (A and B; shards gathered, partial
// ones summed by finalize_grads) with the parity tolerances above. B is set to
// the same random full tensor in both runs so that every path carries gradient.
// Mutation seen to fail (every column-parallel lora_a at tp 2): A not marked
// partial over tp, so its gradient is not summed.
TEST(TensorParallel, LoraMatchesOneProcess) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool llama : {true, false}) {
    for (bool sp : {false, true}) {
      const plan::ModelSpec spec = tiny(llama, true, !llama);
      Comm solo("solo", runtime().rank());
      Transformer single(spec, solo, false, 77), parallel(spec, tp, sp, 77);
      LoraOptions o;
      o.targets = {"all"};
      o.rank = 4;
      o.dropout = 0.3;  // keyed: the row-parallel adapters' inputs by their global features
      apply_lora(single, o);
      apply_lora(parallel, o);
      set_same_random(single, parallel, tp, ".lora_b");
      const int adapters = check_adapter_parity(single, parallel, tp, spec, ".lora_",
                                                fmt::format("llama={} sp={} tp={}", llama, sp, tp.size()));
      EXPECT_EQ(adapters, 2 * static_cast<int>(spec.layers) * (llama ? 7 : 6)) << llama;
    }
  }
}

// RL rollouts (rl/rollout.h) from a tensor-parallel model: every rank samples
// from the gathered logits with the row's generator, so tp 2 generates exactly
// what one process does (tokens equal, log-probs within fp32 rounding), and the
// recomputed log-probs (differentiable, through the gather) agree too.
TEST(TensorParallel, RolloutsEqualOneProcess) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  const plan::ModelSpec spec = tiny(true, true, false);
  Comm solo("solo", runtime().rank());
  Transformer single(spec, solo, false, 5), parallel(spec, tp, false, 5);
  const at::Tensor prompts = at::tensor({5, 17, 42, 8, 1, 2, 3, 4, 60, 61, 62, 63}, at::kLong).view({3, 4});
  RolloutOptions o;
  o.sample.max_new_tokens = 10;
  o.sample.temperature = 1.0;
  const Rollout a = rollout(single, prompts, o, {7, 8, 9}), b = rollout(parallel, prompts, o, {7, 8, 9});
  EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << "tp " << tp.size();
  EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<double>(), 1e-5);
  EXPECT_LT((completion_logprobs(parallel, b.tokens, 4, 1.0) - a.logprobs).abs().max().item<double>(), 1e-5);
}

// Houlsby adapters under tp (replicated parameters; with SP their gradients are
// partial over tp and summed by finalize_grads): loss and adapter gradients
// equal one process, with `up` set to the same random values in both runs.
// Mutation seen to fail (every adapter parameter at tp 2 with SP): gradients
// not marked partial over tp.
TEST(TensorParallel, AdaptersMatchOneProcess) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool sp : {false, true}) {
    const plan::ModelSpec spec = tiny(true, true, false);
    Comm solo("solo", runtime().rank());
    Transformer single(spec, solo, false, 78), parallel(spec, tp, sp, 78);
    apply_adapters(single, AdapterOptions{6});
    apply_adapters(parallel, AdapterOptions{6});
    set_same_random(single, parallel, tp, ".adapter_", ".up.weight");
    EXPECT_EQ(check_adapter_parity(single, parallel, tp, spec, ".adapter_", fmt::format("sp={} tp={}", sp, tp.size())),
              8 * static_cast<int>(spec.layers));  // 2 adapters x 4 tensors per layer
  }
}

// TP: per layer 2 all-reduces of b.s.h forward and 2 backward; plus the
// embedding (forward) and the head input (backward); plus 3 of b.s in the
// cross-entropy. With SP the same volume as all-gathers and reduce-scatters.
TEST(TensorParallel, CommCountersMatchTheFormula) {
  Comm& tp = runtime().world();
  if (tp.size() == 1 || 8 % tp.size() != 0) GTEST_SKIP() << "needs tp > 1 dividing the test model's 8 heads";
  const plan::ModelSpec spec = tiny(true, false, true);
  const double bsh = 2.0 * spec.seq * spec.hidden * 4, bs = 2.0 * spec.seq * 4;
  const int64_t L = spec.layers;
  // The fused cross-entropy: per chunk of tokens one max and one [sum of exponentials; target logit] all-reduce.
  const int64_t tokens = 2 * spec.seq;
  for (bool sp : {false, true}) {
    Transformer model(spec, tp, sp, 1);
    const int64_t rows = default_chunk_rows(tokens, model.padded_vocab() / tp.size(), spec.hidden);
    const uint64_t ce_calls = 2 * static_cast<uint64_t>((tokens + rows - 1) / rows);
    Batch b = batch(spec);
    tp.reset_stats();
    model.forward(b.tokens, b.targets).sum().backward();
    const auto& s = tp.stats();
    if (!sp) {
      EXPECT_EQ(s.at("all_reduce").calls, static_cast<uint64_t>(4 * L + 2) + ce_calls);
      EXPECT_EQ(s.at("all_reduce").bytes, static_cast<uint64_t>((4 * L + 2) * bsh + 3 * bs));
      EXPECT_EQ(s.count("all_gather"), 0u);
    } else {
      EXPECT_EQ(s.at("all_gather").calls, static_cast<uint64_t>(4 * L + 2));
      EXPECT_EQ(s.at("all_gather").bytes, static_cast<uint64_t>((4 * L + 2) * bsh));
      EXPECT_EQ(s.at("reduce_scatter").calls, static_cast<uint64_t>(4 * L + 2));
      EXPECT_EQ(s.at("reduce_scatter").bytes, static_cast<uint64_t>((4 * L + 2) * bsh));
      EXPECT_EQ(s.at("all_reduce").calls, ce_calls);  // the cross-entropy's
    }
  }
}

TEST(TensorParallel, IndivisibleShapesAreClearErrors) {
  Comm& tp = runtime().world();
  if (tp.size() == 1) GTEST_SKIP() << "needs tp > 1";
  plan::ModelSpec bad = tiny(true, false, true);
  bad.heads = tp.size() + 1;
  bad.hidden = 8 * bad.heads;
  bad.kv_heads = bad.heads;
  try {
    Transformer m(bad, tp, false, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("heads"), std::string::npos) << e.what();
  }
  plan::ModelSpec bad_ffn = tiny(true, false, true);
  bad_ffn.heads = bad_ffn.kv_heads = tp.size();
  bad_ffn.hidden = 8 * tp.size();
  bad_ffn.ffn = 97;
  try {
    Transformer m(bad_ffn, tp, false, 1);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ffn (97) is not divisible"), std::string::npos) << e.what();
  }
}

// Global gradient norm and one clipped AdamW step under tp equal one process's:
// every parameter counted once (shards summed, replicated ones once).
// Tolerance of the weights after the step: 1e-3 x lr. Adam's first step moves
// each element by lr x g/(|g| + eps), so it normalises away the gradient's
// scale: an element whose gradient is small differs, relatively, by far more
// than the 1e-4 x max|g| of the gradient test, and that relative difference is
// what shows in the weights (measured: at most 1.8e-4 x lr).
TEST(TensorParallel, GradNormAndAdamWStepMatchOneProcess) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool sp : {false, true}) {
    const plan::ModelSpec spec = tiny(true, true, false);
    Comm solo("solo", runtime().rank());
    Transformer single(spec, solo, false, 99), parallel(spec, tp, sp, 99);
    Batch b = batch(spec);
    (single.forward(b.tokens, b.targets).sum() / b.count).backward();
    (parallel.forward(b.tokens, b.targets).sum() / b.count).backward();
    parallel.finalize_grads();
    AdamWOptions o;
    o.lr = 1e-2;
    o.clip_norm = 0.05;  // below the norm: clipping is active
    AdamW opt1(single.params().params(), o), optp(parallel.params().params(), o);
    const double n1 = opt1.step(nullptr), np = optp.step(&tp);
    EXPECT_NEAR(np, n1, 1e-5 * n1) << "sp=" << sp;
    EXPECT_GT(n1, o.clip_norm);
    const auto& ps = parallel.params().params();
    const auto& rs = single.params().params();
    for (size_t i = 0; i < ps.size(); ++i) {
      at::Tensor w = full(ps[i], tp), w_ref = rs[i].tensor.detach();
      if (ps[i].name == "embed.weight" || ps[i].name == "head.weight") {
        w = w.narrow(0, 0, spec.vocab);
        w_ref = w_ref.narrow(0, 0, spec.vocab);
      }
      EXPECT_LE((w - w_ref).abs().max().item<double>(), 1e-3 * o.lr) << "sp=" << sp << " " << ps[i].name;
    }
  }
}

// Dropout (model/transformer.h: masks keyed by each element's place in the
// unsplit activations): embedding, residual and attention dropout under tp,
// with and without sequence parallelism, naive and tiled attention, drop what
// one process drops, so loss and gradients equal it with the tolerances above.
// The one-process model runs naive attention: the tiled kernel's masks are the
// naive path's. Mutation seen to fail: the heads' offset left at 0 on every tp rank.
TEST(TensorParallel, DropoutMatchesOneProcess) {
  if (8 % runtime().world_size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool llama : {true, false}) {
    plan::ModelSpec spec = tiny(llama, true, !llama);
    spec.dropout = 0.2;
    for (bool sp : {false, true}) {
      for (auto attention : {plan::AttentionImpl::Naive, plan::AttentionImpl::Tiled}) check_parity(spec, sp, attention);
    }
  }
}

// Recomputation changes what is stored, never the result: loss and every
// gradient bitwise equal to no recomputation, with dropout on (the re-run must
// apply the same masks) and with tp / sequence parallelism (collectives re-run).
TEST(TensorParallel, RecomputationGivesIdenticalGradients) {
  Comm& tp = runtime().world();
  if (8 % tp.size() != 0) GTEST_SKIP() << "the test model's 8 heads need tp in 1, 2, 4, 8";
  for (bool sp : {false, true}) {
    for (bool llama : {false, true}) {
      plan::ModelSpec spec = tiny(llama, llama, !llama);
      spec.dropout = 0.1;
      Batch b = batch(spec);
      std::vector<at::Tensor> ref_grads;
      double ref_loss = 0;
      for (auto r : {nn::Recompute::None, nn::Recompute::Selective, nn::Recompute::Full}) {
        Transformer model(spec, tp, sp, 11);
        model.set_recompute(r);
        at::Tensor loss = model.forward(b.tokens, b.targets).sum() / b.count;
        // A pipeline runs other micro-batches between a forward and its backward: the
        // re-run must drop what the forward dropped, not what the model is keyed to now.
        model.set_dropout_rows(99);
        loss.backward();
        model.finalize_grads();
        // The next step's masks: its own (the recomputation left the keys as they were).
        model.set_dropout_step(2);
        at::Tensor again = model.forward(b.tokens, b.targets).sum() / b.count;
        std::vector<at::Tensor> grads;
        for (const auto& p : model.params().params()) {
          if (!p.tensor.grad().defined()) ADD_FAILURE() << p.name << " " << plan::to_string(r);
          grads.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::zeros({1}));
        }
        grads.push_back(again.detach().reshape({1}));
        if (r == nn::Recompute::None) {
          ref_grads = grads;
          ref_loss = loss.item<double>();
          continue;
        }
        EXPECT_EQ(loss.item<double>(), ref_loss) << plan::to_string(r) << " sp=" << sp << " llama=" << llama;
        for (size_t i = 0; i < grads.size(); ++i) {
          EXPECT_TRUE(at::equal(grads[i], ref_grads[i]))
              << plan::to_string(r) << " sp=" << sp << " llama=" << llama << " tensor " << i;
        }
      }
    }
  }
}

TEST(TensorParallel, ParameterCountMatchesThePlanner) {
  Comm solo("solo", runtime().rank());
  for (const char* name : {"gpt-tiny", "llama-tiny"}) {
    plan::ModelSpec spec = plan::preset(name);
    Transformer m(spec, solo, false, 1);
    const auto counts = plan::count_params(spec, 128);
    EXPECT_EQ(m.params().local_numel(), counts.total) << name;
  }
}

}  // namespace
}  // namespace meshtrain::test
