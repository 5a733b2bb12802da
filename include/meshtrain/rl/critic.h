// A value model: the transformer's trunk with a value head (a linear map of
// the final hidden state to one number per position), for PPO's critic
// (rl/ppo.h) and a learned reward model (its value at a sequence's last
// token). As TRL's value model and OpenRLHF's critic: the trunk starts from
// the policy's (SFT) weights, the head fresh.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/rl/grpo_objective.h"

namespace meshtrain {

class Transformer;

// Registers value_head.weight [1, h] (normal, std 1 / (h + 1), OpenRLHF's
// init) and value_head.bias [1] (zeros), replicated over tp, and freezes an
// untied language-model head (a value model does not use it). Call before the
// optimizer is built.
void add_value_head(Transformer& m);
bool has_value_head(Transformer& m);

// Values [b, s] of `tokens` [b, s]: position j's is the value of the state
// tokens[:, ..j] (before token j + 1 is generated). Differentiable in grad mode.
at::Tensor values(Transformer& m, const at::Tensor& tokens, bool train = false);

// What the critic regresses on, over rows like a RolloutBatch's (rl/grpo_objective.h).
struct ValueBatch {
  at::Tensor tokens;      // [R, S]
  at::Tensor old_values;  // [R, S - 1]: the critic's values at rollout (positions 0 .. S - 2)
  at::Tensor returns;     // [R, S - 1]: GAE's returns
  at::Tensor mask;        // [R, S - 1]: the policy's tokens
};

// The critic's objective: vf_coef × rl/ppo.h's clipped value loss, a mean over
// the global batch's policy tokens. Metrics: the fraction of tokens where the
// clipped term won, and the mean squared error to the returns.
class ValueObjective : public Objective {
 public:
  ValueObjective(double clip, double coef) : clip_(clip), coef_(coef) {}
  void set_batch(ValueBatch b) { batch_ = std::move(b); }
  Batch rows(const std::vector<uint64_t>& ids) const;

  double units(const Batch& b) const override;
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override;
  std::vector<std::string> metrics() const override { return {"value_clipped", "value_mse"}; }

 private:
  double clip_, coef_;
  ValueBatch batch_;
};

}  // namespace meshtrain
