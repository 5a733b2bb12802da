// Post-training plans: the adapter and RL ledgers against their papers, and the search over layouts
// (plan/posttrain_search.h) giving answers a practitioner would sign.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "meshtrain/plan/count.h"
#include "meshtrain/plan/posttrain.h"
#include "meshtrain/plan/posttrain_search.h"

namespace meshtrain::plan {
namespace {

// LoRA paper: GPT-3 175B, r = 4 on Wq and Wv: 96 x 2 x 4 x (12288 + 12288) =
// 18.9M trainable parameters, a 35 MB checkpoint (fp16) against 350 GB.
TEST(PostTraining, LoraPaperGpt3) {
  LoraOptions o;
  o.rank = 4;
  o.targets = "qv";
  const int64_t n = lora_params(preset("gpt3-175b"), o);
  EXPECT_EQ(n, 18874368);
  EXPECT_NEAR(n * 2 / 1e6, 37.7, 0.1);  // MB in fp16; the paper rounds to "35 MB"
}

// Adapters named as peft/lora.h matches them count as the planner's qv and all; an adapter run's
// FLOPs leave out the frozen base's weight gradients (2 N_matmul) and add 6 per adapter parameter.
TEST(PostTraining, AdapterCountsAndFlops) {
  const ModelSpec m = preset("llama2-7b");
  LoraOptions qv, all;
  qv.rank = all.rank = 16;
  all.targets = "all";
  EXPECT_EQ(lora_params_matching(m, 16, {"attn.q", "attn.v"}), lora_params(m, qv));
  EXPECT_EQ(lora_params_matching(m, 16, {"all"}), lora_params(m, all));
  EXPECT_EQ(lora_params_matching(m, 16, {}), lora_params(m, all));
  EXPECT_EQ(lora_params_matching(m, 16, {"mlp.down"}), 16 * m.layers * (m.ffn + m.hidden));
  const int64_t n = lora_params(m, qv);
  const double full = train_flops_per_token(m, 4096), adapters = adapter_train_flops_per_token(m, 4096, n);
  EXPECT_DOUBLE_EQ(full - adapters, 2.0 * count_params(m).matmul_active - 6.0 * n);
}

// QLoRA: constants cost 0.5 bit per parameter, 0.127 with double quantisation,
// saving 0.373 bit per parameter, about 3 GB for a 65B model.
TEST(PostTraining, QloraBits) {
  EXPECT_DOUBLE_EQ(qlora_bits_per_param(false), 4.5);
  EXPECT_NEAR(qlora_bits_per_param(true) - 4.0, 0.127, 0.0005);
  EXPECT_NEAR((qlora_bits_per_param(false) - qlora_bits_per_param(true)) * 65e9 / 8 / 1e9, 3.0, 0.05);
  Strategy s;
  s.global_batch = 1;
  LoraOptions q;
  q.qlora = true;
  q.rank = 16;
  StageLedger l = lora_ledger(preset("llama2-7b"), s, q);
  // The blocks' linears in NF4 (32 layers x (4 x 4096^2 + 3 x 4096 x 11008)); embeddings, head and norms in bf16.
  const double linear = 32.0 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008);
  EXPECT_EQ(block_linear_weights(preset("llama2-7b")), static_cast<int64_t>(linear));
  const double rest = static_cast<double>(count_params(preset("llama2-7b")).total) - linear;
  EXPECT_DOUBLE_EQ(l.lines[0].bytes, linear * qlora_bits_per_param(true) / 8 + rest * 2);
}

// GRPO drops PPO's critic and reward model: two models (one without the KL term).
TEST(PostTraining, GrpoHoldsNoCritic) {
  Strategy s;
  s.tp = 8;
  s.global_batch = 1;
  const double psi = count_params(preset("llama2-7b")).total / 8.0;
  const StageLedger ppo = rlhf_ledger(preset("llama2-7b"), s, RlhfOptions{});
  const StageLedger grpo = grpo_ledger(preset("llama2-7b"), s, RlhfOptions{}, true);
  const StageLedger bare = grpo_ledger(preset("llama2-7b"), s, RlhfOptions{}, false);
  EXPECT_DOUBLE_EQ(grpo.line("actor (trained)").bytes, 16 * psi);
  EXPECT_DOUBLE_EQ(grpo.line("reference (frozen)").bytes, 2 * psi);
  EXPECT_DOUBLE_EQ(grpo.line("rollout KV cache").bytes, ppo.line("rollout KV cache").bytes);
  // PPO - GRPO = the critic (16 psi) and the reward model (2 psi).
  EXPECT_NEAR(ppo.device_total() - grpo.device_total(), (16 + 2) * psi * (1 + 0.05), 1e-3 * psi);
  EXPECT_NEAR(grpo.device_total() - bare.device_total(), 2 * psi * 1.05, 1e-3 * psi);
}

TEST(PostTraining, RlhfHoldsFourModels) {
  Strategy s;
  s.tp = 8;
  s.global_batch = 1;
  StageLedger l = rlhf_ledger(preset("llama2-7b"), s, RlhfOptions{});
  const double psi = count_params(preset("llama2-7b")).total / 8.0;
  EXPECT_DOUBLE_EQ(l.line("actor (trained)").bytes, 16 * psi);
  EXPECT_DOUBLE_EQ(l.line("reference (frozen)").bytes, 2 * psi);
  // KV cache: 2 x 32 layers x 32 kv heads x 128 x 2 B / tp 8 per token x 8 x 1024 tokens.
  EXPECT_DOUBLE_EQ(l.line("rollout KV cache").bytes, 2.0 * 32 * 32 * 128 * 2 / 8 * 8 * 1024);
  // In fp32 (meshtrain's CPU runs): trained 16 B (4 + 4 + 8), frozen weights and the KV cache 4 B.
  s.precision = Precision::Fp32;
  const StageLedger f = rlhf_ledger(preset("llama2-7b"), s, RlhfOptions{});
  EXPECT_DOUBLE_EQ(f.line("actor (trained)").bytes, 16 * psi);
  EXPECT_DOUBLE_EQ(f.line("reward (frozen)").bytes, 4 * psi);
  EXPECT_DOUBLE_EQ(f.line("rollout KV cache").bytes, 2 * l.line("rollout KV cache").bytes);
  EXPECT_THROW(lora_params(preset("llama2-7b"), LoraOptions{0}), std::invalid_argument);
}


// ---------------------------------------------------------------- the search

PostTrainInput input(const std::string& method, const std::string& model, int gpus, int64_t seq, int64_t global_batch) {
  PostTrainInput in;
  in.method = post_train_method(method);
  in.search.model = preset(model);
  in.search.gpu = gpu_preset("h100");
  in.search.gpus = gpus;
  in.search.seq = seq;
  in.search.global_batch = global_batch;
  in.search.precision = Precision::Bf16;
  return in;
}

bool says(const PostTrainResult& r, const std::string& text) {
  return std::any_of(r.explanation.begin(), r.explanation.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

// Every ranked plan fits, the first is the fastest, and its ledger and time are what the method's own
// functions give for its layout.
void expect_sound(const PostTrainInput& in, const PostTrainResult& r) {
  ASSERT_FALSE(r.ranked.empty());
  ASSERT_TRUE(r.fastest && r.leanest);
  EXPECT_EQ(r.feasible, static_cast<int>(r.ranked.size()));
  for (const PostTrainCandidate& c : r.ranked) {
    EXPECT_LE(c.peak_bytes, in.search.gpu.memory_bytes) << c.strategy.describe();
    EXPECT_LE(r.ranked.front().step_s, c.step_s) << c.strategy.describe();
    EXPECT_GE(c.step_s, r.fastest->step_s);
    EXPECT_GE(c.peak_bytes, r.leanest->peak_bytes);
  }
  const PostTrainCandidate& best = r.ranked.front();
  EXPECT_DOUBLE_EQ(best.peak_bytes, post_train_ledger(in, best.strategy).device_total());
  EXPECT_DOUBLE_EQ(best.step_s, post_train_step_seconds(in, best.strategy));
  EXPECT_TRUE(says(r, fmt::format("recomputation {}", to_string(best.strategy.recompute)))) << r.explanation[1];
}

// QLoRA's headline (Dettmers et al.: a 65B model fine-tuned on one 48 GB GPU): 70B at 4096 tokens on one
// 80 GB H100 fits in NF4 only with full recomputation (every activation kept would need the GPU twice over),
// and the explanation says what that costs.
TEST(PostTrainSearch, Qlora70bOnOneGpuFitsWithFullRecomputation) {
  const PostTrainInput in = input("qlora", "llama2-70b", 1, 4096, 4);
  const PostTrainResult r = search_post_training(in);
  expect_sound(in, r);
  EXPECT_EQ(r.ranked.front().strategy.recompute, Recompute::Full);
  EXPECT_GT(r.fastest->peak_bytes, in.search.gpu.memory_bytes);
  EXPECT_TRUE(says(r, "fitting costs")) << r.explanation[2];
  EXPECT_TRUE(says(r, "full recomputation:"));
  // LoRA in bf16 holds the 70B base in 2 bytes a parameter: 140 GB, nothing fits one GPU.
  const PostTrainResult lora = search_post_training(input("lora", "llama2-70b", 1, 4096, 4));
  EXPECT_TRUE(lora.ranked.empty());
  EXPECT_TRUE(says(lora, "nothing fits"));
  EXPECT_TRUE(says(lora, "or qlora"));
}

// Full SFT of a 7B on one node of 8 H100s: 112 GB of model states must be sharded (ZeRO) or split (tp);
// the answer fits and names its recomputation.
TEST(PostTrainSearch, Sft7bOnEightGpus) {
  const PostTrainInput in = input("sft", "llama2-7b", 8, 4096, 64);
  const PostTrainResult r = search_post_training(in);
  expect_sound(in, r);
  const Strategy& s = r.ranked.front().strategy;
  EXPECT_TRUE(s.zero >= 1 || s.tp > 1) << s.describe();
  // SFT's ledger is pretraining's.
  EXPECT_DOUBLE_EQ(r.ranked.front().peak_bytes, memory_ledger(in.search.model, s).peak().device_total());
}

// PPO's four 7B models (actor and critic trained, reference and reward frozen) across one node.
TEST(PostTrainSearch, Ppo7bOnEightGpus) {
  const PostTrainInput in = input("ppo", "llama2-7b", 8, 1024, 64);
  const PostTrainResult r = search_post_training(in);
  expect_sound(in, r);
  const StageLedger& l = r.ranked.front().ledger;
  EXPECT_NO_THROW(l.line("critic (trained)"));
  EXPECT_NO_THROW(l.line("reward (frozen)"));
  // GRPO drops the critic and the reward model: the same layout needs less and runs faster.
  PostTrainInput g = in;
  g.method = PostTrainMethod::Grpo;
  const Strategy& s = r.ranked.front().strategy;
  EXPECT_LT(post_train_ledger(g, s).device_total(), r.ranked.front().peak_bytes);
  EXPECT_LT(post_train_step_seconds(g, s), r.ranked.front().step_s);
}

// DPO holds both sequences of each pair and a frozen reference: pretraining's ledger at twice the
// micro-batch plus the reference's weights; without the reference both shrink.
TEST(PostTrainSearch, DpoCountsPairsAndItsReference) {
  PostTrainInput in = input("dpo", "llama2-7b", 8, 2048, 32);
  Strategy s;
  s.tp = 2, s.dp = 4, s.sp = true, s.zero = 1, s.micro_batch = 2, s.seq = 2048, s.global_batch = 32;
  s.recompute = Recompute::Full, s.flash = true;
  Strategy pairs = s;
  pairs.micro_batch = 4, pairs.global_batch = 64;
  const StageLedger l = post_train_ledger(in, s);
  const double psi = static_cast<double>(count_params(in.search.model).total) / 2;
  EXPECT_DOUBLE_EQ(l.line("reference (frozen)").bytes, 2 * psi);
  EXPECT_DOUBLE_EQ(l.line("activations").bytes, memory_ledger(in.search.model, pairs).peak().line("activations").bytes);
  const double with = post_train_step_seconds(in, s);
  in.reference = false;
  EXPECT_LT(post_train_ledger(in, s).device_total(), l.device_total() - 2 * psi);
  EXPECT_LT(post_train_step_seconds(in, s), with);
  in.method = PostTrainMethod::Sft;
  EXPECT_LT(post_train_step_seconds(in, s), with);
  expect_sound(input("dpo", "llama2-7b", 8, 2048, 32), search_post_training(input("dpo", "llama2-7b", 8, 2048, 32)));
}

// At one layout: adapters skip the base's weight gradients (faster than SFT); QLoRA pays for dequantising
// its NF4 linears every pass (slower than LoRA, by more under full recomputation's third pass).
TEST(PostTrainSearch, AdapterStepTimesOrder) {
  PostTrainInput in = input("sft", "llama2-7b", 1, 4096, 4);
  Strategy s;
  s.micro_batch = 1, s.seq = 4096, s.global_batch = 4, s.flash = true;
  const double sft = post_train_step_seconds(in, s);
  in.method = PostTrainMethod::Lora;
  const double lora = post_train_step_seconds(in, s);
  in.method = PostTrainMethod::Qlora;
  const double qlora = post_train_step_seconds(in, s);
  EXPECT_LT(lora, sft);
  EXPECT_GT(lora, 0.5 * sft);  // forward + input gradients: about two thirds of the FLOPs
  EXPECT_GT(qlora, lora);
  s.recompute = Recompute::Full;
  const double qlora_full = post_train_step_seconds(in, s);
  in.method = PostTrainMethod::Lora;
  EXPECT_GT(qlora_full - post_train_step_seconds(in, s), qlora - lora);
}

// `plan` throws std::invalid_argument whose message holds `says`.
template <typename F>
void expect_refused(F plan, const std::string& says, const std::string& what) {
  try {
    plan();
    ADD_FAILURE() << what << " was planned";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

// What the user fixed is honoured; what the ledgers cannot plan is refused with the fix.
TEST(PostTrainSearch, FixedChoicesAndRefusals) {
  PostTrainInput in = input("lora", "llama2-7b", 8, 4096, 32);
  in.search.fixed.recompute = Recompute::None;
  in.search.fixed.tp = 2;
  const PostTrainResult r = search_post_training(in);
  ASSERT_FALSE(r.ranked.empty());
  for (const PostTrainCandidate& c : r.ranked) {
    EXPECT_EQ(c.strategy.recompute, Recompute::None);
    EXPECT_EQ(c.strategy.tp, 2);
  }
  in.search.fixed.cp = 2;
  expect_refused([&] { search_post_training(in); }, "drop --cp and --ep", "cp 2");
  in.search.fixed.cp.reset();
  in.search.fixed.pp = 4;
  in.search.fixed.vpp = 2;
  expect_refused([&] { search_post_training(in); }, "only sft plans an interleaved pipeline", "lora with vpp 2");
  // SFT's ledger and step are pretraining's: a fixed interleaving is planned, with its smaller bubble.
  PostTrainInput sft = input("sft", "llama2-13b", 8, 4096, 32);
  sft.search.fixed.tp = 1, sft.search.fixed.pp = 4, sft.search.fixed.micro_batch = 1;
  sft.search.fixed.recompute = Recompute::Full;
  const PostTrainResult plain = search_post_training(sft);
  sft.search.fixed.vpp = 10;
  const PostTrainResult interleaved = search_post_training(sft);
  ASSERT_FALSE(plain.ranked.empty());
  ASSERT_FALSE(interleaved.ranked.empty());
  EXPECT_EQ(interleaved.ranked.front().strategy.schedule, Schedule::Interleaved);
  EXPECT_EQ(interleaved.ranked.front().strategy.vpp, 10);
  EXPECT_LT(interleaved.ranked.front().step_s, plain.ranked.front().step_s);
  expect_refused([] { post_train_method("rlhf"); }, "'rlhf'; use pretrain, sft, dpo, lora, qlora, ppo or grpo",
                 "method rlhf");
}

}  // namespace
}  // namespace meshtrain::plan
