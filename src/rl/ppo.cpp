#include "meshtrain/rl/ppo.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "meshtrain/rl/grpo.h"

namespace meshtrain {
namespace {

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.dim() != 2 || a.sizes() != b.sizes()) throw std::invalid_argument(fmt::format("{}: tensors must be [B, T] alike", what));
}

}  // namespace

KlEstimator parse_kl_estimator(const std::string& s) {
  if (s == "k1") return KlEstimator::K1;
  if (s == "k3") return KlEstimator::K3;
  throw std::invalid_argument(fmt::format("KL estimator \"{}\": use k1 or k3", s));
}

at::Tensor kl_shaped_rewards(const at::Tensor& old_logp, const at::Tensor& ref_logp, const at::Tensor& mask,
                             const at::Tensor& scores, double kl_coef, KlEstimator k) {
  check_same(old_logp, ref_logp, "kl_shaped_rewards");
  check_same(old_logp, mask, "kl_shaped_rewards");
  if (scores.dim() != 1 || scores.size(0) != mask.size(0)) throw std::invalid_argument("kl_shaped_rewards: scores [B]");
  const at::Tensor m = mask.to(at::kDouble);
  const at::Tensor lp = old_logp.to(at::kDouble), ref = ref_logp.to(at::kDouble);
  const at::Tensor kl = k == KlEstimator::K1 ? lp - ref : k3_kl(lp, ref);
  at::Tensor r = -kl_coef * kl * m;
  // The last policy token of each row: the largest masked index.
  const int64_t T = m.size(1);
  const at::Tensor idx = at::arange(T, at::kDouble).unsqueeze(0).expand_as(m);
  const at::Tensor last = (idx * m - (1 - m)).argmax(1);  // -1 where unmasked, so the max is the last masked index
  const at::Tensor has = m.sum(1) > 0;
  r.scatter_add_(1, last.unsqueeze(1), (scores.to(at::kDouble) * has.to(at::kDouble)).unsqueeze(1));
  return r.to(old_logp.scalar_type());
}

Gae gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask, double gamma, double lambda) {
  check_same(rewards, values, "gae");
  check_same(rewards, mask, "gae");
  const at::Tensor r = rewards.to(at::kDouble).contiguous(), v = values.detach().to(at::kDouble).contiguous();
  const at::Tensor m = mask.to(at::kDouble).contiguous();
  at::Tensor adv = at::zeros_like(r), ret = at::zeros_like(r);
  const auto R = r.accessor<double, 2>(), V = v.accessor<double, 2>(), M = m.accessor<double, 2>();
  auto A = adv.accessor<double, 2>(), Ret = ret.accessor<double, 2>();
  for (int64_t b = 0; b < r.size(0); ++b) {
    double next_value = 0, next_adv = 0;
    for (int64_t t = r.size(1) - 1; t >= 0; --t) {
      if (M[b][t] == 0) continue;
      const double delta = R[b][t] + gamma * next_value - V[b][t];
      A[b][t] = delta + gamma * lambda * next_adv;
      Ret[b][t] = A[b][t] + V[b][t];
      next_value = V[b][t];
      next_adv = A[b][t];
    }
  }
  return {adv.to(rewards.scalar_type()), ret.to(rewards.scalar_type())};
}

at::Tensor masked_moments(const at::Tensor& x, const at::Tensor& mask) {
  check_same(x, mask, "masked_moments");
  const at::Tensor d = x.detach().to(at::kDouble), m = mask.to(at::kDouble);
  return at::stack({(d * m).sum(), (d * d * m).sum(), m.sum()});
}

at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, const at::Tensor& moments) {
  check_same(x, mask, "masked_whiten");
  const double n = moments[2].item<double>();
  if (n < 2) throw std::invalid_argument(fmt::format("masked_whiten: {} masked entries; whitening needs at least 2", n));
  const double mean = moments[0].item<double>() / n;
  // Unbiased: Σ (x − mean)² / (n − 1) = (Σ x² − n mean²) / (n − 1).
  const double var = std::max(0.0, (moments[1].item<double>() - n * mean * mean) / (n - 1));
  const at::Tensor m = mask.to(at::kDouble);
  return ((x.detach().to(at::kDouble) - mean) / std::sqrt(var + 1e-8) * m).to(x.scalar_type());
}

ValueTerms value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                      const at::Tensor& mask, double clip) {
  check_same(values, old_values, "value_loss");
  check_same(values, returns, "value_loss");
  check_same(values, mask, "value_loss");
  const at::Tensor m = mask.to(values.scalar_type());
  const at::Tensor old = old_values.detach().to(values.scalar_type()), ret = returns.detach().to(values.scalar_type());
  const at::Tensor plain = (values - ret).pow(2);
  const at::Tensor clipped = (at::clamp(values, old - clip, old + clip) - ret).pow(2);
  ValueTerms t;
  t.loss = 0.5 * (at::max(plain, clipped) * m).sum();
  const double n = m.sum().item<double>();
  t.clipped = n > 0 ? ((clipped.detach() > plain.detach()).to(m.scalar_type()) * m).sum().item<double>() / n : 0;
  return t;
}

}  // namespace meshtrain
