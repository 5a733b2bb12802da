// Post-training plans that search (issue #46): `meshtrain plan --method sft | dpo | lora | qlora | ppo
// | grpo` enumerates tp, pp, ZeRO, recomputation and the micro-batch as pretraining's search does (cp
// and ep stay 1: the post-training ledgers split no sequence and no experts), keeps what fits the
// device by the method's ledger (plan/posttrain.h; SFT is pretraining's ledger), and ranks by an
// estimated step time built from pretraining's (plan/estimate.h):
//   sft    pretraining's step: full fine-tuning computes and stores what pretraining does.
//   dpo    pairs: the chosen and the rejected sequence of each pair in one forward (TRL's
//          concatenated_forward; meshtrain's DpoObjective packs them the same way), so twice the
//          sequences of a pretraining step, plus the frozen reference's forward (a third of the
//          training FLOPs) and its weights in memory.
//   lora, qlora   pretraining's compute and bubble scaled by adapter / full training FLOPs (no weight
//          gradients of the frozen base: plan/count.h), its tp and pp traffic; data parallelism only
//          reduces the adapters' gradients (neglected). QLoRA adds dequantising the NF4 linears to
//          16 bits in every pass (Dettmers et al., arXiv 2305.14314: read 4.127 bits, write 16).
//   ppo, grpo   the trained models' steps (PPO: actor and critic; GRPO: the actor), the frozen
//          models' forwards over the batch (PPO: reference and reward; GRPO: the reference when the
//          KL term is on), and the rollout: prefill at the forward's FLOP rate, then one decoding step
//          per generated token, bounded by reading the rank's weights and KV cache from memory
//          (decoding is bandwidth-bound: Pope et al., "Efficiently Scaling Transformer Inference",
//          arXiv 2211.05102), pipeline stages in series.
// The explanation says what fitting cost: the fastest layout of all, when it does not fit, and how much
// slower the best fitting one is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/plan/posttrain.h"
#include "meshtrain/plan/search.h"

namespace meshtrain::plan {

enum class PostTrainMethod { Sft, Dpo, Lora, Qlora, Ppo, Grpo };
// "sft" ... "grpo"; throws std::invalid_argument naming the value and the choices.
PostTrainMethod post_train_method(const std::string& name);
std::string to_string(PostTrainMethod m);
bool lora_method(PostTrainMethod m);  // lora, qlora: a frozen base with adapters

struct PostTrainInput {
  SearchInput search;  // model, device, GPUs, sequence, global batch (pairs for DPO), precision, fixed choices
  PostTrainMethod method = PostTrainMethod::Sft;
  LoraOptions lora;    // lora, qlora (qlora is set from the method)
  RlhfOptions rl;      // ppo, grpo
  bool reference = true;  // dpo's reference model and grpo's KL term
};

struct PostTrainCandidate {
  Strategy strategy;
  StageLedger ledger;
  double peak_bytes = 0;
  double step_s = 0;
};

struct PostTrainResult {
  std::vector<PostTrainCandidate> ranked;  // fits, fastest first
  std::optional<PostTrainCandidate> leanest, fastest;  // of all valid ones
  int considered = 0, feasible = 0;
  std::vector<std::string> explanation;
};

// One rank's ledger of `method` under `s` (the ledger the search compares with the device's memory).
StageLedger post_train_ledger(const PostTrainInput& in, const Strategy& s);
// Estimated seconds of one optimizer step (one rollout and update for ppo, grpo) under `s`.
double post_train_step_seconds(const PostTrainInput& in, const Strategy& s);
// Throws std::invalid_argument for what the search cannot plan (cp or ep fixed above 1, bad sizes).
PostTrainResult search_post_training(const PostTrainInput& in);

}  // namespace meshtrain::plan
