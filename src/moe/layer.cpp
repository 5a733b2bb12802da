#include "meshtrain/moe/layer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "meshtrain/comm/comm.h"

namespace meshtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity on y; in backward, `weight` becomes the gradient of `loss` (a
// scalar the router computed), whatever reaches y. The loss thus joins the
// objective with that weight (Megatron-Core's MoEAuxLossAutoScaler).
struct AttachLoss : torch::autograd::Function<AttachLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& loss, double weight) {
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["dtype"] = static_cast<int64_t>(loss.scalar_type());
    return y.view_as(y);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g[0], at::full({}, ctx->saved_data["weight"].toDouble(), at::TensorOptions().dtype(dtype)), at::Tensor()};
  }
};

// The router losses' share of this rank's tokens when a sequence is split
// across `group` (sequence parallelism; null: not split): f_e counts the
// assignments of the whole sequence (summed over the group) and both means
// divide by its tokens, so the shares sum over the group to the losses of the
// whole sequence, and so do their gradients (Megatron-Core reduces
// tokens_per_expert over tp the same way).
std::pair<at::Tensor, at::Tensor> router_losses(const Routing& r, Comm* group, int64_t local_tokens, int64_t k) {
  at::Tensor assigned = r.assigned;
  double tokens = static_cast<double>(local_tokens);
  if (group) {
    assigned = assigned.clone();
    group->all_reduce(assigned);
    tokens *= group->size();
  }
  const double E = static_cast<double>(assigned.size(0));
  const at::Tensor aux = (assigned / (tokens * static_cast<double>(k)) * (r.density_sum / tokens)).sum() * E;
  return {aux, r.lse2_sum / tokens};
}

}  // namespace

void MoeStats::reset() {
  std::fill(tokens.begin(), tokens.end(), 0.0);
  assignments = dropped = aux = z = 0;
  forwards = 0;
}

MoeLayer::MoeLayer(ParamStore& store, const std::string& prefix, const plan::ModelSpec& spec, Comm* ep,
                   Comm* sequence_group, int64_t index)
    : aux_coef_(spec.aux_loss_coef), z_coef_(spec.z_loss_coef), ep_(ep && ep->size() > 1 ? ep : nullptr),
      sequence_(sequence_group && sequence_group->size() > 1 ? sequence_group : nullptr),
      index_(index) {
  opts_.experts = spec.experts;
  opts_.top_k = spec.top_k;
  opts_.kind = parse_router(spec.router);
  opts_.capacity_factor = spec.capacity_factor;
  const int64_t E = spec.experts, h = spec.hidden, f = spec.expert_width();
  const int ep_rank = ep_ ? ep_->rank() : 0, ep_size = ep_ ? ep_->size() : 1;
  const bool sequence_partial = sequence_ != nullptr;
  if (E % ep_size != 0) {
    throw std::invalid_argument(fmt::format("model.experts = {} is not divisible by parallel.ep = {}: choose an ep "
                                            "that divides the experts",
                                            E, ep_size));
  }
  const double std = spec.init_std, out_std = spec.init_std / std::sqrt(2.0 * spec.layers);
  router_ = store.create(prefix + ".router.weight", {E, h}, Init::Normal, std, -1, sequence_partial);
  w_.w1 = store.create_experts(prefix + ".experts.w1", {E, f, h}, std, ep_rank, ep_size, sequence_partial);
  if (spec.activation == plan::Activation::SwiGLU) {
    w_.w3 = store.create_experts(prefix + ".experts.w3", {E, f, h}, std, ep_rank, ep_size, sequence_partial);
  }
  w_.w2 = store.create_experts(prefix + ".experts.w2", {E, h, f}, out_std, ep_rank, ep_size, sequence_partial);
  stats_.tokens.assign(static_cast<size_t>(E), 0.0);
}

at::Tensor MoeLayer::forward(const at::Tensor& x, double loss_weight) {
  const int64_t h = x.size(-1);
  const at::Tensor flat = x.reshape({-1, h});
  const Routing r = route(at::matmul(flat, router_.t().to(flat.scalar_type())), opts_);
  int64_t remote = 0;
  at::Tensor y = run_experts(flat, r, w_, ep_, &remote).view(x.sizes());
  exchanges_.forwards += 1;
  exchanges_.rows_forward += remote;
  if (at::GradMode::is_enabled()) {
    exchanges_.backwards += 1;
    exchanges_.rows_backward += remote;
  }
  // Training: recorded once per forward that builds a graph (recomputation's
  // first, gradient-free pass does not).
  if (loss_weight > 0 && at::GradMode::is_enabled()) {
    const at::Tensor kept = r.per_expert.to(at::kDouble).contiguous();
    for (int64_t e = 0; e < opts_.experts; ++e) stats_.tokens[static_cast<size_t>(e)] += kept.data_ptr<double>()[e];
    stats_.assignments += static_cast<double>(r.expert.numel());
    stats_.dropped += static_cast<double>(r.dropped);
    const auto [aux, z] = router_losses(r, sequence_, flat.size(0), opts_.top_k);
    stats_.aux += aux.item<double>();  // shares: they and the forward sum over the sequence's ranks
    stats_.z += z.item<double>();
    stats_.forwards += sequence_ ? 1.0 / sequence_->size() : 1.0;
    const at::Tensor loss = aux * aux_coef_ + z * z_coef_;
    if (aux_coef_ > 0 || z_coef_ > 0) y = AttachLoss::apply(y, loss, loss_weight);
  }
  return y;
}

}  // namespace meshtrain
