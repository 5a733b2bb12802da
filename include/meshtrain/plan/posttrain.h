// Post-training ledgers (seed 003 "后训练工程账"): LoRA / QLoRA and RLHF with
// four models. Bytes per rank, one line per item with its formula.
//   LoRA (Hu et al., arXiv 2106.09685): an adapted d_out x d_in weight gains
//     r (d_in + d_out) trainable parameters; frozen weights need no gradient or
//     optimizer state.
//   QLoRA (Dettmers et al., arXiv 2305.14314): NF4 base weights, 4 bits plus
//     block-64 absmax constants: 32/64 = 0.5 bit, or 8/64 + 32/(64*256) = 0.127
//     bit with double quantisation.
//   PPO (InstructGPT; DeepSpeed-Chat arXiv 2308.01320): actor and critic
//     trained, reference and reward frozen, plus the rollout's KV cache
//     2 L g d_head x 2 B per token.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/memory.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

struct LoraOptions {
  int64_t rank = 8;
  // Which weights get adapters: "qv" (the LoRA paper's choice) or "all" (q, k, v, o and the MLP).
  std::string targets = "qv";
  bool qlora = false;
  bool double_quant = true;  // QLoRA's second quantisation of the constants
};

// Trainable adapter parameters for the whole model.
int64_t lora_params(const ModelSpec& m, const LoraOptions& o);
// The same for adapters on every block linear whose name ("layers.3.attn.q",
// "layers.0.mlp.down", model/transformer.cpp's names) contains one of `targets`
// (empty or "all": every block linear), as peft/lora.h matches them.
int64_t lora_params_matching(const ModelSpec& m, int64_t rank, const std::vector<std::string>& targets);
// Bits per base parameter under QLoRA: 4 + constants.
double qlora_bits_per_param(bool double_quant);
// The blocks' linear weights (q, k, v, o, the MLP's; no biases): what QLoRA
// stores in NF4. Embeddings, norms, biases and the head keep their precision.
int64_t block_linear_weights(const ModelSpec& m);

// Per-rank bytes of adapter fine-tuning's model states in the precision of
// `s` (fp32: 4 B per base weight, adapters 4 + 4 + 8; mixed: 2 B, 2 + 2 + 12),
// the adapters' states sharded by ZeRO as in `s`; the vocabulary padded to
// `vocab_multiple` as the runtime pads it.
struct LoraStates {
  double base = 0;  // frozen weights (NF4 linears + the rest under QLoRA)
  ModelStates adapters;
};
LoraStates lora_state_bytes(const ModelSpec& m, const Strategy& s, const LoraOptions& o, int64_t vocab_multiple = 1);

// Ledger of one rank fine-tuning `m` with adapters; `s` gives tp/pp/dp, micro-batch,
// sequence and recomputation (ZeRO applies to the adapters' state).
StageLedger lora_ledger(const ModelSpec& m, const Strategy& s, const LoraOptions& o);

struct RlhfOptions {
  int64_t rollout_batch = 8;       // sequences generated at once
  int64_t prompt_tokens = 512, generated_tokens = 512;
};

// PPO with actor and critic the shape of `m` (trained in the precision of `s`:
// 16 B per parameter in fp32 and in mixed precision, sharded by ZeRO as in
// `s`) and reference and reward models frozen (weights only: 4 B in fp32, else
// 2 B), all split over tp x pp.
StageLedger rlhf_ledger(const ModelSpec& m, const Strategy& s, const RlhfOptions& o);

// GRPO (arXiv 2402.03300): no critic and no reward model (a verifiable reward);
// the actor trained as in `s`, a frozen reference only when the KL term
// is on (`reference`), and the rollout's KV cache for rollout_batch sequences.
StageLedger grpo_ledger(const ModelSpec& m, const Strategy& s, const RlhfOptions& o, bool reference);

}  // namespace meshtrain::plan
