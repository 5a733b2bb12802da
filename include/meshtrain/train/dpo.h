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

#include <ATen/core/Tensor.h>

namespace meshtrain {

class Transformer;

enum class DpoLoss { Sigmoid, Ipo, Hinge };
DpoLoss parse_dpo_loss(const std::string& s);  // sigmoid | ipo | hinge; throws naming the value

struct DpoResult {
  at::Tensor loss;  // scalar, differentiable through the policy's log-probs
  double chosen_reward = 0, rejected_reward = 0, margin = 0, accuracy = 0;
};

// Log-probability of each sequence's targets (targets < 0 ignored): the sum
// over positions of log p(target). tokens, targets [b, s]; returns [b] (fp32;
// the same on every tp rank).
at::Tensor sequence_logprobs(Transformer& m, const at::Tensor& tokens, const at::Tensor& targets, bool train);

// Per-pair log-probs [n] of the policy (differentiable) and the reference.
DpoResult dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                   const at::Tensor& ref_rejected, double beta, DpoLoss kind);

}  // namespace meshtrain
