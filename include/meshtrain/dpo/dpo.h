// Direct preference optimisation (Rafailov et al., arXiv 2305.18290) and its
// IPO and hinge variants, as functions of sequence log-probabilities.
//
// For a prompt x with a chosen answer y_w and a rejected one y_l, the implicit
// reward of the policy πθ against the frozen reference π_ref is
//   r(y) = β (log πθ(y | x) − log π_ref(y | x)),   h = r(y_w) − r(y_l),
// and the per-pair losses are
//   sigmoid (DPO):                         −log σ(h)
//   ipo     (Azar et al., arXiv 2310.12036): (h / β − 1 / (2β))²
//   hinge   (SLiC, Zhao et al., arXiv 2305.10425): max(0, 1 − h)
// averaged over the pairs. Logged: the mean chosen and rejected rewards, the
// mean margin h, and the accuracy (the fraction of pairs with h > 0).
//
// The reference can be an explicit frozen copy of the starting model, or, with
// LoRA, the policy itself with its adapters disabled (peft/lora.h): the same
// weights without a second copy.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/train/objective.h"

namespace meshtrain {

class Transformer;

enum class DpoLoss { Sigmoid, Ipo, Hinge };
DpoLoss parse_dpo_loss(const std::string& s);  // sigmoid | ipo | hinge; throws naming the value

struct DpoResult {
  at::Tensor loss;      // scalar, the mean over pairs, differentiable through the policy's log-probs
  at::Tensor per_pair;  // [n], the same per pair
  at::Tensor chosen, rejected;  // [n] rewards (detached)
  double chosen_reward = 0, rejected_reward = 0, margin = 0, accuracy = 0;  // means over the pairs
};

// Log-probability of each sequence's targets (targets < 0 ignored): the sum
// over positions of log p(target). tokens, targets [b, s]; returns [b] (fp32;
// the same on every tp rank).
at::Tensor sequence_logprobs(Transformer& m, const at::Tensor& tokens, const at::Tensor& targets, bool train);

// Per-pair log-probs [n] of the policy (differentiable) and the reference.
DpoResult dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                   const at::Tensor& ref_rejected, double beta, DpoLoss kind);

struct DpoOptions {
  double beta = 0.1;
  DpoLoss loss = DpoLoss::Sigmoid;
};

// DPO as a training objective: batches from the loader with group = 2 (data/
// preference.h: row 2i the chosen sequence of pair i, row 2i+1 its rejected
// one); units are pairs. `reference` is the frozen reference model; null means
// the policy itself with its LoRA adapters disabled (it must have some). The
// reference's log-probs are computed without gradients and without dropout.
// A pair with no target in either row (validation's padding, data/
// validation.h) is no pair: it counts as no unit and adds nothing.
// Metrics: rewards/chosen, rewards/rejected, margin, accuracy.
class DpoObjective : public Objective {
 public:
  DpoObjective(DpoOptions o, Transformer* reference) : o_(o), reference_(reference) {}
  double units(const Batch& b) const override;
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override;
  std::vector<std::string> metrics() const override { return {"rewards/chosen", "rewards/rejected", "margin", "accuracy"}; }

 private:
  DpoOptions o_;
  Transformer* reference_;
};

}  // namespace meshtrain
