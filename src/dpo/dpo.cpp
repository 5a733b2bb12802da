#include "meshtrain/dpo/dpo.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <ATen/core/grad_mode.h>

#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/lora.h"

namespace meshtrain {

DpoLoss parse_dpo_loss(const std::string& s) {
  if (s == "sigmoid") return DpoLoss::Sigmoid;
  if (s == "ipo") return DpoLoss::Ipo;
  if (s == "hinge") return DpoLoss::Hinge;
  throw std::invalid_argument(fmt::format("DPO loss \"{}\": use sigmoid, ipo or hinge", s));
}

at::Tensor sequence_logprobs(Transformer& m, const at::Tensor& tokens, const at::Tensor& targets, bool train) {
  // The model's per-token loss is −log p(target) ([s, b]), 0 where the target is ignored.
  return -m.forward(tokens, targets, train).sum(0);
}

DpoResult dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                   const at::Tensor& ref_rejected, double beta, DpoLoss kind) {
  if (!(beta > 0)) throw std::invalid_argument(fmt::format("DPO beta {} must be positive", beta));
  if (policy_chosen.sizes() != policy_rejected.sizes() || policy_chosen.sizes() != ref_chosen.sizes() ||
      policy_chosen.sizes() != ref_rejected.sizes() || policy_chosen.dim() != 1) {
    throw std::invalid_argument("dpo_loss: four log-prob vectors of one length (one entry per pair)");
  }
  const at::Tensor chosen = beta * (policy_chosen - ref_chosen.detach());
  const at::Tensor rejected = beta * (policy_rejected - ref_rejected.detach());
  const at::Tensor h = chosen - rejected;
  at::Tensor per_pair;
  switch (kind) {
    case DpoLoss::Sigmoid: per_pair = -at::log_sigmoid(h); break;
    case DpoLoss::Ipo: per_pair = (h / beta - 1.0 / (2.0 * beta)).pow(2); break;
    case DpoLoss::Hinge: per_pair = at::relu(1.0 - h); break;
  }
  DpoResult r;
  r.per_pair = per_pair;
  r.chosen = chosen.detach();
  r.rejected = rejected.detach();
  r.loss = per_pair.mean();
  r.chosen_reward = chosen.mean().item<double>();
  r.rejected_reward = rejected.mean().item<double>();
  r.margin = h.mean().item<double>();
  r.accuracy = (h > 0).to(at::kDouble).mean().item<double>();
  return r;
}

namespace {

// [pairs] bool: the pairs with a target in either row.
at::Tensor live_pairs(const Batch& b) {
  if (b.tokens.size(0) % 2 != 0) {
    throw std::invalid_argument(fmt::format("a DPO batch holds chosen/rejected pairs; it has {} rows", b.tokens.size(0)));
  }
  return (b.targets >= 0).any(1).view({-1, 2}).any(1);
}

}  // namespace

double DpoObjective::units(const Batch& b) const { return live_pairs(b).sum().item<double>(); }

at::Tensor DpoObjective::loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) {
  const at::Tensor live = live_pairs(b);
  const int64_t rows = b.tokens.size(0);
  // One forward over chosen and rejected rows together (one ZeRO-3 gather, one DDP backward).
  const at::Tensor policy = sequence_logprobs(m, b.tokens, b.targets, train);
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    if (reference_) {
      ref = sequence_logprobs(*reference_, b.tokens, b.targets, false);
    } else {
      enable_lora(m, false);
      try {
        ref = sequence_logprobs(m, b.tokens, b.targets, false);
      } catch (...) {
        enable_lora(m, true);
        throw;
      }
      enable_lora(m, true);
    }
  }
  const DpoResult r = dpo_loss(policy.slice(0, 0, rows, 2), policy.slice(0, 1, rows, 2), ref.slice(0, 0, rows, 2),
                               ref.slice(0, 1, rows, 2), o_.beta, o_.loss);
  // A padded pair's log-probs are 0 in both models: every term below is 0 for it but the loss's and accuracy's.
  metric_sums.at(0) += r.chosen.sum().item<double>();
  metric_sums.at(1) += r.rejected.sum().item<double>();
  metric_sums.at(2) += (r.chosen - r.rejected).sum().item<double>();
  metric_sums.at(3) += ((r.chosen > r.rejected) & live).sum().item<double>();
  return at::where(live, r.per_pair, at::zeros_like(r.per_pair)).sum();
}

}  // namespace meshtrain
