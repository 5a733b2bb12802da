#include "meshtrain/train/step.h"

#include "meshtrain/train/objective.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <limits>
#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/moe/metrics.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"

namespace meshtrain {

TrainStep::TrainStep(Transformer& model, AdamW& opt, Comm& dp, Comm& tp, StepOptions o)
    : model_(model), opt_(opt), dp_(dp), tp_(tp), o_(o) {
  if (o_.ddp && o_.zero) throw std::invalid_argument("a step uses DDP or ZeRO, not both");
  if (o_.precision == Precision::Fp16 && !o_.scaler) {
    throw std::invalid_argument("fp16 training needs a loss scaler (its gradients underflow without one)");
  }
}

StepResult TrainStep::run(const std::vector<Batch>& host_batches, const UpdateGate& gate) {
  if (host_batches.empty()) throw std::invalid_argument("a step needs at least one micro-batch");
  std::vector<Batch> micro_batches;
  for (const auto& b : host_batches) micro_batches.push_back(on_compute_device(b));
  NextTokenObjective next_token;
  Objective& objective = o_.objective ? *o_.objective : next_token;
  // Gradients accumulate over this step's micro-batches only.
  if (o_.zero) {
    o_.zero->zero_grad();
  } else {
    for (auto& p : model_.params().params()) p.tensor.mutable_grad() = at::Tensor();
    if (o_.ddp) o_.ddp->zero_grad();  // its gradients: views of its buckets
    if (o_.ddp_experts) o_.ddp_experts->zero_grad();
  }
  // The global batch's units, counted once before any backward (step.h's invariant).
  at::Tensor count = at::zeros({1}, at::kDouble);
  for (const auto& b : micro_batches) count += objective.units(b);
  dp_.all_reduce(count);
  const double tokens = count.item<double>();
  if (tokens == 0) throw std::invalid_argument("the global batch has no target tokens (all ignored)");
  std::vector<double> metric_sums(objective.metrics().size(), 0.0);
  double loss_sum = 0;
  const double scale = o_.scaler ? o_.scaler->scale() : 1.0;
  // Router losses: a mean over every micro-batch of every data-parallel replica (moe/layer.h).
  model_.set_moe_loss_weight(scale / static_cast<double>(micro_batches.size() * static_cast<size_t>(dp_.size())));
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const Batch& b = micro_batches[i];
    const bool last = i + 1 == micro_batches.size();  // reduce in the last backward only
    if (o_.ddp) o_.ddp->set_sync(last);
    if (o_.ddp_experts) o_.ddp_experts->set_sync(last);
    model_.set_dropout_rows(b.first_row);
    at::Tensor summed;
    {
      AutocastGuard precision(o_.precision);
      summed = objective.loss(model_, b, true, metric_sums);
    }
    at::Tensor loss = summed / tokens;
    (o_.scaler ? loss * scale : loss).backward();
    if (o_.zero) o_.zero->after_backward();
    loss_sum += loss.item<double>();
  }
  // Data-parallel sum, then the tensor-parallel sums of sequence-partial
  // gradients (sums commute; but DDP's finish() writes whole gradients back,
  // so it must come first or it would undo the tp sums).
  // ZeRO reduces into this rank's slices and finalises them itself.
  if (o_.zero) {
    o_.zero->finish();
  } else if (o_.ddp) {
    o_.ddp->finish();
    if (o_.ddp_experts) o_.ddp_experts->finish();
  } else {
    all_reduce_gradients(model_.params().params(), dp_, o_.expert_dp);
  }
  if (!o_.zero) model_.finalize_grads();
  StepResult r;
  r.loss_scale = scale;
  auto& updated = o_.zero ? o_.zero->shard_params() : model_.params().params();
  // The loss and the metric sums in one all-reduce, before the update: the gate judges them.
  std::vector<double> sums{loss_sum};
  sums.insert(sums.end(), metric_sums.begin(), metric_sums.end());
  at::Tensor l = at::tensor(sums, at::kDouble);
  dp_.all_reduce(l);
  r.loss = l[0].item<double>();
  const auto names = objective.metrics();
  for (size_t i = 0; i < names.size(); ++i) r.metrics.emplace_back(names[i], l[1 + i].item<double>() / tokens);
  r.tokens = static_cast<int64_t>(tokens);
  std::vector<Comm*> saw_apart{&dp_};  // ranks that routed different tokens
  if (model_.sequence_parallel()) saw_apart.push_back(&tp_);
  MoeMetrics moe = collect_moe_metrics(model_.moe_layers(), saw_apart, model_.spec());
  r.metrics.insert(r.metrics.end(), moe.values.begin(), moe.values.end());
  r.expert_tokens = std::move(moe.tokens);
  const bool finite = !o_.scaler || o_.scaler->unscale(updated, {&tp_, &dp_});
  if (o_.scaler) o_.scaler->update(finite);
  if (finite) {
    r.grad_norm = opt_.grad_norm(&tp_, {o_.zero ? &o_.zero->shard_group() : nullptr});
    r.dropped = gate && !gate(r.loss, r.grad_norm);
    if (!r.dropped) {
      opt_.update(r.grad_norm);
      if (o_.zero) o_.zero->after_step();
    }
  } else {
    r.skipped = true;
    r.grad_norm = std::numeric_limits<double>::quiet_NaN();
  }
  r.lr = opt_.last_lr();
  return r;
}

// The one place the loss normaliser is computed: target tokens of the global batch.
double count_target_tokens(const std::vector<Batch>& micro_batches, Comm& dp) {
  at::Tensor count = at::zeros({1}, at::kDouble);
  for (const auto& b : micro_batches) count += (b.targets >= 0).sum().to(at::kDouble);
  dp.all_reduce(count);
  const double tokens = count.item<double>();
  if (tokens == 0) throw std::invalid_argument("the global batch has no target tokens (all ignored)");
  return tokens;
}

namespace {

// The gradients of `params` whose expert flag is `experts`, summed over `group`.
void all_reduce_some(std::vector<Param>& params, Comm& group, bool experts) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> grads;
  for (auto& p : params) {
    if (p.frozen || p.expert != experts) continue;  // frozen: LoRA's base, no gradient
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    grads.push_back(p.tensor.grad());
  }
  if (grads.empty()) return;
  std::vector<at::Tensor> flat_parts;
  for (auto& g : grads) flat_parts.push_back(g.reshape({-1}).to(at::kFloat));
  at::Tensor flat = at::cat(flat_parts);
  group.all_reduce(flat);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace

// A sum, not an average: each token's loss is already divided by the global count.
void all_reduce_gradients(std::vector<Param>& params, Comm& dp, Comm* expert_dp) {
  all_reduce_some(params, dp, false);
  all_reduce_some(params, expert_dp ? *expert_dp : dp, true);
}

}  // namespace meshtrain
