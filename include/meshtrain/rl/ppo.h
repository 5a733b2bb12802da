// PPO for language models (Schulman et al., arXiv 1707.06347, in the RLHF
// setup of Ouyang et al., arXiv 2203.02155), following TRL's PPOTrainer (the
// spec in shared/reference/methods.md §1.4): the pieces between the rollout and
// the two losses, as functions of [B, T] tensors over target positions, where
// `mask` marks the policy's own tokens (generated; not prompt, padding or an
// environment's reply).
//
// 1. KL-shaped rewards: per policy token r_t = −kl_coef · kl_t with
//    kl_t = lp_old − lp_ref (k1) or k3 (rl/grpo.h), and the sequence's score
//    added at its last policy token.
// 2. GAE (Schulman et al., arXiv 1506.02438), backwards over each row's policy
//    tokens in order (positions outside the mask are skipped: an environment's
//    reply is part of the transition, not an action):
//      δ_t = r_t + γ V_next − V_t,   Â_t = δ_t + γλ Â_next,   R_t = Â_t + V_t,
//    with V_next = Â_next = 0 after the last policy token.
// 3. The actor's loss is GRPO's clipped surrogate (rl/grpo.h) with these
//    per-token advantages, whitened over the global batch (mean 0, var 1).
// 4. The critic's clipped value loss (per token, summed over the mask):
//      ½ max((V − R)², (clamp(V, V_old − ε_v, V_old + ε_v) − R)²).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace meshtrain {

enum class KlEstimator { K1, K3 };
KlEstimator parse_kl_estimator(const std::string& s);  // k1 | k3; throws naming the value

// old_logp, ref_logp, mask [B, T]; scores [B]. Returns r [B, T] (0 outside the
// mask); a row without policy tokens gets no score.
at::Tensor kl_shaped_rewards(const at::Tensor& old_logp, const at::Tensor& ref_logp, const at::Tensor& mask,
                             const at::Tensor& scores, double kl_coef, KlEstimator k);

struct Gae {
  at::Tensor advantages, returns;  // [B, T], 0 outside the mask
};
// rewards, values, mask [B, T] (values detached: the rollout's critic).
Gae gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask, double gamma, double lambda);

// Whitening over masked entries with the moments of the whole (global) batch:
// `moments` = masked_moments summed over every rank; (x − mean) / sqrt(var + 1e-8)
// with var unbiased (TRL's masked_whiten), 0 outside the mask.
at::Tensor masked_moments(const at::Tensor& x, const at::Tensor& mask);  // [3] double: Σ m x, Σ m x², Σ m
at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, const at::Tensor& moments);

struct ValueTerms {
  at::Tensor loss;      // Σ_mask ½ max(...) (a sum: the caller divides by the global token count)
  double clipped = 0;   // fraction of masked tokens where the clipped term was the larger
};
// values (differentiable), old_values, returns, mask [B, T].
ValueTerms value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                      const at::Tensor& mask, double clip);

}  // namespace meshtrain
