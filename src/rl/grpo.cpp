#include "meshtrain/rl/grpo.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain {

GrpoLoss parse_grpo_loss(const std::string& s) {
  if (s == "grpo") return GrpoLoss::Grpo;
  if (s == "bnpo") return GrpoLoss::Bnpo;
  if (s == "dr_grpo") return GrpoLoss::DrGrpo;
  if (s == "dapo") return GrpoLoss::Dapo;
  throw std::invalid_argument(fmt::format("GRPO loss \"{}\": use grpo, bnpo, dr_grpo or dapo", s));
}

at::Tensor group_advantages(const at::Tensor& rewards, int64_t group, bool scale) {
  if (group < 2) {
    throw std::invalid_argument(fmt::format("GRPO needs at least 2 completions per prompt for a group baseline (got {})",
                                            group));
  }
  if (rewards.dim() != 1 || rewards.numel() % group != 0) {
    throw std::invalid_argument(fmt::format("{} rewards are not whole groups of {}", rewards.numel(), group));
  }
  const at::Tensor r = rewards.to(at::kDouble).view({-1, group});
  at::Tensor a = r - r.mean(1, true);
  if (scale) a = a / (r.std(1, /*unbiased=*/true, true) + 1e-4);
  return a.reshape({-1}).to(rewards.scalar_type());
}

at::Tensor k3_kl(const at::Tensor& logp, const at::Tensor& ref_logp) {
  const at::Tensor d = ref_logp - logp;
  return at::exp(d) - d - 1;
}

GrpoTerms grpo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& ref_logp,
                    const at::Tensor& advantages, const at::Tensor& mask, const GrpoOptions& o, double tokens) {
  if (logp.sizes() != old_logp.sizes() || logp.sizes() != mask.sizes() || logp.dim() != 2 ||
      !(advantages.sizes() == logp.sizes() || (advantages.dim() == 1 && advantages.size(0) == logp.size(0)))) {
    throw std::invalid_argument("grpo_loss: logp, old_logp and mask [B, T], advantages [B] or [B, T]");
  }
  const at::Tensor m = mask.to(logp.scalar_type());
  const at::Tensor a = advantages.dim() == 1 ? advantages.to(logp.scalar_type()).unsqueeze(1)
                                             : advantages.to(logp.scalar_type());
  const at::Tensor w = at::exp(logp - old_logp.detach());
  const at::Tensor clipped = at::clamp(w, 1 - o.epsilon_low, 1 + o.epsilon_high);
  at::Tensor per_token = -at::min(w * a, clipped * a);
  GrpoTerms t;
  const double masked = m.sum().item<double>();
  if (o.beta != 0) {
    if (!ref_logp.defined()) throw std::invalid_argument("grpo_loss: beta != 0 needs the reference's log-probs");
    const at::Tensor kl = k3_kl(logp, ref_logp.detach());
    per_token = per_token + o.beta * (o.kl_ratio ? kl * w : kl);
    t.kl = masked > 0 ? (kl * m).sum().item<double>() / masked : 0;
  }
  const at::Tensor summed = per_token * m;
  switch (o.loss) {
    case GrpoLoss::Grpo: t.loss = (summed.sum(1) / m.sum(1).clamp_min(1)).mean(); break;
    case GrpoLoss::Bnpo: t.loss = summed.sum() / std::max(1.0, masked); break;
    case GrpoLoss::DrGrpo:
      if (o.max_completion < 1) throw std::invalid_argument("grpo_loss: dr_grpo needs max_completion");
      t.loss = summed.sum() / static_cast<double>(logp.size(0) * o.max_completion);
      break;
    case GrpoLoss::Dapo:
      if (!(tokens > 0)) throw std::invalid_argument("grpo_loss: dapo needs the global batch's token count");
      t.loss = summed.sum() / tokens;
      break;
  }
  if (masked > 0) {
    const at::Tensor wd = w.detach();
    t.clip_low = (((wd < 1 - o.epsilon_low) & (a < 0)).to(m.scalar_type()) * m).sum().item<double>() / masked;
    t.clip_high = (((wd > 1 + o.epsilon_high) & (a > 0)).to(m.scalar_type()) * m).sum().item<double>() / masked;
  }
  return t;
}

}  // namespace meshtrain
