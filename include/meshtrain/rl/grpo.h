// GRPO (Shao et al., DeepSeekMath, arXiv 2402.03300) as functions of
// log-probabilities, following TRL's GRPOTrainer (the reference spec in
// shared/reference/methods.md §1.3).
//
// Rewards r_i of the G completions of each prompt (rows g·G .. g·G + G − 1)
// give advantages
//   A_i = (r_i − mean_g) / (std_g + 1e-4)   (std with Bessel's correction; "group")
//   A_i = r_i − mean_g                       ("none": Dr. GRPO, arXiv 2503.20783)
// broadcast to every token of completion i. Per token, with the importance
// ratio w = exp(lp − lp_old),
//   L_t = −min(w A, clamp(w, 1 − ε_low, 1 + ε_high) A) + β k3   (× w with kl_ratio),
//   k3  = exp(lp_ref − lp) − (lp_ref − lp) − 1     (Schulman's estimator of KL(π‖π_ref), ≥ 0)
// kl_ratio weighs each token's k3 by its (differentiable) importance ratio w, so that its gradient
// is the unbiased gradient of KL(π‖π_ref) for samples drawn from π_old (DeepSeek-V3.2, arXiv
// 2512.02556; trl's GRPOConfig.use_bias_correction_kl, its default since trl 1.x).
// and over the completion mask m (generated, non-tool tokens) the loss is
//   grpo:    mean over completions of Σ_t m L / max(1, Σ_t m)   (the paper's; length-biased)
//   bnpo:    Σ m L / max(1, Σ m)                               (this batch's tokens)
//   dr_grpo: Σ m L / (B · max_completion)                      (a constant denominator)
//   dapo:    Σ m L / tokens                                    (`tokens`: the global batch's
//            masked tokens, counted once before the step, as train/step.h counts targets)
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace meshtrain {

enum class GrpoLoss { Grpo, Bnpo, DrGrpo, Dapo };
GrpoLoss parse_grpo_loss(const std::string& s);  // grpo | bnpo | dr_grpo | dapo; throws naming the value

// rewards [groups · G] -> advantages [groups · G]. Throws std::invalid_argument
// for G < 2 (no group baseline) or a count that is not whole groups.
at::Tensor group_advantages(const at::Tensor& rewards, int64_t group, bool scale = true);

// Per-token k3 estimate of KL(π‖π_ref).
at::Tensor k3_kl(const at::Tensor& logp, const at::Tensor& ref_logp);

struct GrpoOptions {
  double epsilon_low = 0.2, epsilon_high = 0.2;
  double beta = 0.0;  // KL weight (0: no reference needed)
  bool kl_ratio = false;  // the k3 term times the importance ratio (see above)
  GrpoLoss loss = GrpoLoss::Dapo;
  int64_t max_completion = 0;  // dr_grpo's denominator (per completion)
};

struct GrpoTerms {
  at::Tensor loss;  // scalar, differentiable through `logp`
  // Over masked tokens: ratio clipped below with A < 0, above with A > 0; mean k3 KL.
  double clip_low = 0, clip_high = 0, kl = 0;
};

// logp, old_logp, mask [B, T]; ref_logp [B, T] (undefined when beta = 0);
// advantages [B] (a sequence's, GRPO) or [B, T] (per token, PPO: rl/ppo.h);
// `tokens`: dapo's denominator (ignored otherwise).
GrpoTerms grpo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& ref_logp,
                    const at::Tensor& advantages, const at::Tensor& mask, const GrpoOptions& o, double tokens = 0);

}  // namespace meshtrain
