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
  at::Tensor on_device[3];  // CUDA gradients: summed there, read once (not one host sync per parameter)
  for (const auto& p : params) {
    const at::Tensor& g = p.tensor.grad();
    if (!g.defined() || p.replica) continue;
    const int which = p.expert ? 2 : p.tp_dim >= 0 ? 0 : 1;
    if (g.is_cuda()) {
      const at::Tensor sq = at::linalg_vector_norm(g, 2, std::nullopt, false, at::kDouble).square();
      on_device[which] = on_device[which].defined() ? on_device[which] + sq : sq;
      continue;
    }
    (which == 2 ? experts : which == 0 ? sharded : replicated) += sum_of_squares(g);
  }
  auto read = [](const at::Tensor& t) { return t.defined() ? t.item<double>() : 0.0; };
  sharded += read(on_device[0]);
  replicated += read(on_device[1]);
  experts += read(on_device[2]);
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

namespace {

// CUDA: PyTorch's multi-tensor AdamW kernel (torch.optim.AdamW(fused=True)), one launch per
// group of fp32 parameters that decay alike instead of eight per parameter. The same update
// as below, rounded as that kernel rounds it: denom = sqrt(v) / sqrt(bc2) + eps; the clip is
// applied as grad / grad_scale. Returns false (nothing done) where it does not apply.
bool fused_cuda_update(std::vector<Param>& params, std::vector<at::Tensor>& m, std::vector<at::Tensor>& v,
                       const AdamWOptions& o, double lr, double clip, int64_t step) {
  if (params.empty() || !params[0].tensor.is_cuda()) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].tensor.grad();
    if (params[i].tensor.scalar_type() != at::kFloat || (g.defined() && g.scalar_type() != at::kFloat)) return false;
  }
  const auto dev = params[0].tensor.options();
  // The kernel reads the step (the optimizer counts it): one scalar shared by every entry.
  const at::Tensor steps = at::full({}, static_cast<double>(step), dev.dtype(at::kFloat));
  const std::optional<at::Tensor> scale =
      clip != 1.0 ? std::optional<at::Tensor>(at::full({}, 1.0 / clip, dev.dtype(at::kFloat))) : std::nullopt;
  for (bool decay : {true, false}) {
    std::vector<at::Tensor> w, g, ms, vs, st;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].tensor.grad();
      if (!grad.defined() || (decays(params[i], o) && o.weight_decay > 0) != decay) continue;
      w.push_back(params[i].tensor.detach());
      g.push_back(grad);
      ms.push_back(m[i]);
      vs.push_back(v[i]);
      st.push_back(steps);
    }
    if (w.empty()) continue;
    at::_fused_adamw_(w, g, ms, vs, {}, st, lr, o.beta1, o.beta2, decay ? o.weight_decay : 0.0, o.eps, false, false,
                      scale, std::nullopt);
  }
  return true;
}

}  // namespace

void AdamW::update(double norm) {
  const double clip = o_.clip_norm > 0 && norm > o_.clip_norm ? o_.clip_norm / (norm + 1e-6) : 1.0;
  ++step_;
  lr_ = learning_rate(o_, step_);
  if (o_.fused && fused_cuda_update(params_, m_, v_, o_, lr_, clip, step_)) return;
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
