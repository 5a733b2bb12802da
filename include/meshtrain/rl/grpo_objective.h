// GRPO as a training objective (train/objective.h) over one rollout batch:
// the rows (prompt + completion, right-padded), their rollout log-probs,
// completion masks and advantages are set before the optimisation epochs
// (PPO's actor is this objective with per-token advantages and beta = 0);
// each micro-batch names its rows in Batch::windows. The loss is rl/grpo.h's
// per-token loss summed; the units (what the step divides by, over the global
// batch) give the aggregation: completion tokens (dapo), completions (grpo:
// each completion's token mean), completions x max_completion (dr_grpo).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/rl/grpo.h"
#include "meshtrain/train/objective.h"

namespace meshtrain {

struct RolloutBatch {
  at::Tensor tokens;      // [R, S] int64
  at::Tensor old_logp;    // [R, S - 1]: log p(tokens[:, j + 1]) at sampling, 0 outside the mask
  at::Tensor mask;        // [R, S - 1] fp32: 1 where tokens[:, j + 1] was generated
  at::Tensor advantages;  // [R] (GRPO: a completion's) or [R, S - 1] (PPO: per token, rl/ppo.h)
};

// A micro-batch of rows `ids` of `tokens` (Batch::windows = the row ids).
Batch row_batch(const at::Tensor& tokens, const std::vector<uint64_t>& ids);
// The rows of `t` [R, ...] that micro-batch `b` (made by row_batch) holds.
at::Tensor rows_of(const at::Tensor& t, const Batch& b);

class GrpoObjective : public Objective {
 public:
  // `reference`: the frozen reference model for the KL term (beta > 0), or
  // null for the policy with its LoRA adapters off; unused when beta = 0.
  GrpoObjective(GrpoOptions o, double temperature, int64_t vocab_limit, Transformer* reference)
      : o_(o), temperature_(temperature), vocab_limit_(vocab_limit), reference_(reference) {}
  void set_rollouts(RolloutBatch b) { rollouts_ = std::move(b); }
  // A micro-batch of rows (windows = row ids).
  Batch rows(const std::vector<uint64_t>& ids) const;

  double units(const Batch& b) const override;
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override;
  std::vector<std::string> metrics() const override { return {"kl", "clip_low", "clip_high", "entropy"}; }

 private:
  GrpoOptions o_;
  double temperature_;
  int64_t vocab_limit_;
  Transformer* reference_;
  RolloutBatch rollouts_;
};

// log p(tokens[:, j + 1] | tokens[:, ..j]) [B, S - 1] under softmax(logits / T)
// over the first vocab_limit ids: one forward (differentiable in grad mode).
// With `entropy`, also each position's entropy of that distribution (detached).
at::Tensor token_logprobs(Transformer& m, const at::Tensor& tokens, double temperature, int64_t vocab_limit, bool train,
                          at::Tensor* entropy = nullptr);

}  // namespace meshtrain
