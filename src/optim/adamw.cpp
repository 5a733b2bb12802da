#include "meshtrain/optim/adamw.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "optim/fused_adamw.h"
#include "optim/sum_squares.h"

namespace meshtrain {

LrSchedule parse_lr_schedule(const std::string& s) {
  if (s == "constant") return LrSchedule::Constant;
  if (s == "linear") return LrSchedule::Linear;
  if (s == "cosine") return LrSchedule::Cosine;
  throw std::invalid_argument(fmt::format("unknown lr schedule '{}'; use constant, linear or cosine", s));
}

double learning_rate(const AdamWOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * static_cast<double>(step) / o.warmup_steps;
  if (o.schedule == LrSchedule::Constant) return o.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  const double min_lr = o.lr * o.min_lr_ratio;
  const double shape = o.schedule == LrSchedule::Linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + (o.lr - min_lr) * shape;
}

bool decays(const Param& p, const AdamWOptions& o) {
  if (p.decay >= 0) return p.decay == 1;
  if (p.full_shape.size() < 2) return false;  // norms and biases
  const bool embedding = p.name == "embed.weight" || p.name == "pos.weight";
  return !embedding || o.decay_embeddings;
}

double global_grad_norm(const std::vector<Param>& params, Comm* tp, const std::vector<Comm*>& sum_over, Comm* ep) {
  // Sharded parameters: sum of squares over the shards; replicated ones: this
  // rank's copy only, identical on every tp rank, so added once after the sum;
  // experts (replicated over tp): summed over the ep ranks that split them.
  double sharded = 0, replicated = 0, experts = 0;
  for (const auto& p : params) {
    const at::Tensor& g = p.tensor.grad();
    if (!g.defined() || p.replica) continue;
    const double sq = sum_of_squares(g);
    (p.expert ? experts : p.tp_dim >= 0 ? sharded : replicated) += sq;
  }
  for (Comm* group : sum_over) {
    if (!group || group->size() == 1) continue;
    at::Tensor s = at::tensor({sharded, replicated, experts}, at::kDouble);
    group->all_reduce(s);
    sharded = s[0].item<double>();
    replicated = s[1].item<double>();
    experts = s[2].item<double>();
  }
  if (ep && ep->size() > 1) {
    at::Tensor s = at::tensor({experts}, at::kDouble);
    ep->all_reduce(s);
    experts = s.item<double>();
  }
  if (tp && tp->size() > 1) {
    at::Tensor s = at::tensor({sharded}, at::kDouble);
    tp->all_reduce(s);
    sharded = s.item<double>();
  }
  return std::sqrt(sharded + replicated + experts);
}

AdamW::AdamW(std::vector<Param>& params, AdamWOptions o) : params_(params), o_(o) {
  if (o.lr <= 0 || o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1 || o.eps <= 0 || o.weight_decay < 0) {
    throw std::invalid_argument(fmt::format("AdamW: lr {} > 0, betas ({}, {}) in [0, 1), eps {} > 0, weight decay {} "
                                            ">= 0 required",
                                            o.lr, o.beta1, o.beta2, o.eps, o.weight_decay));
  }
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p.tensor, at::TensorOptions().dtype(at::kFloat)));
    v_.push_back(at::zeros_like(p.tensor, at::TensorOptions().dtype(at::kFloat)));
  }
}

double AdamW::step(Comm* tp, const std::vector<Comm*>& sum_over) {
  const double norm = grad_norm(tp, sum_over);
  update(norm);
  return norm;
}

double AdamW::grad_norm(Comm* tp, const std::vector<Comm*>& sum_over) const {
  return global_grad_norm(params_, tp, sum_over, ep_);
}

void AdamW::update(double norm) {
  const double clip = o_.clip_norm > 0 && norm > o_.clip_norm ? o_.clip_norm / (norm + 1e-6) : 1.0;
  ++step_;
  lr_ = learning_rate(o_, step_);
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(step_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    at::Tensor g = p.tensor.grad();
    if (!g.defined()) continue;  // replicas are updated like the rest
    const bool decay = decays(p, o_) && o_.weight_decay > 0;
    // The coefficients as the ATen ops below round them: computed in double, applied in fp32.
    const AdamWCoefficients k{static_cast<float>(clip),
                              static_cast<float>(o_.beta1),
                              static_cast<float>(o_.beta2),
                              static_cast<float>(o_.eps),
                              static_cast<float>(1.0 - o_.beta1),
                              static_cast<float>(1.0 - o_.beta2),
                              decay ? static_cast<float>(1.0 - lr_ * o_.weight_decay) : 1.0f,
                              static_cast<float>(lr_ / bc1),
                              static_cast<float>(bc2)};
    if (o_.fused && fused_adamw_update(p.tensor.detach(), g, m_[i], v_[i], k)) continue;
    g = g.to(at::kFloat);
    if (clip != 1.0) g = g * clip;
    m_[i].mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
    v_[i].mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
    at::Tensor w = p.tensor.detach();
    if (decay) w.mul_(1.0 - lr_ * o_.weight_decay);
    at::Tensor denom = (v_[i] / bc2).sqrt_().add_(o_.eps);
    w.addcdiv_(m_[i], denom, -lr_ / bc1);
  }
}

}  // namespace meshtrain
