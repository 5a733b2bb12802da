#include "meshtrain/train/pipeline_step.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/moe/metrics.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/parallel/pipeline/executor.h"

namespace meshtrain {

std::vector<Param> pipeline_params(const std::vector<Transformer*>& chunks) {
  std::vector<Param> out;
  for (Transformer* c : chunks) {
    for (const auto& p : c->params().params()) out.push_back(p);
  }
  return out;
}

PipelineTrainStep::PipelineTrainStep(std::vector<Transformer*> chunks, PipelineExecutor& exec, AdamW& opt, Comm& dp,
                                     Comm& tp, Comm& pp, std::vector<ShardedDataParallel*> zero, Precision precision,
                                     Comm* expert_dp)
    : chunks_(std::move(chunks)), exec_(exec), opt_(opt), dp_(dp), tp_(tp), pp_(pp), zero_(std::move(zero)),
      precision_(precision), expert_dp_(expert_dp), params_(pipeline_params(chunks_)) {
  if (!zero_.empty()) {
    if (zero_.size() != chunks_.size()) {
      throw std::invalid_argument(fmt::format("{} ZeRO wrappers for {} pipeline chunks", zero_.size(), chunks_.size()));
    }
    for (ShardedDataParallel* z : zero_) {
      if (z->stage() != 1) {
        throw std::invalid_argument(fmt::format("parallel.zero = {} with pipeline parallelism: stage 2 would "
                                                "reduce-scatter, and stage 3 re-gather, once per micro-batch on every "
                                                "stage; use parallel.zero = 1 (or 0) with pp > 1",
                                                z->stage()));
      }
    }
    exec_.set_finalize_grads(false);  // ZeRO sums sequence-partial gradients on its slices
  }
  if (precision_ == Precision::Fp16) {
    throw std::invalid_argument("fp16 pipeline training: the schedules have no loss scaler; use bf16");
  }
}

StepResult PipelineTrainStep::run(const std::vector<Batch>& micro, const UpdateGate& gate) {
  if (micro.empty()) throw std::invalid_argument("a step needs at least one micro-batch");
  if (zero_.empty()) {
    for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
  } else {
    for (ShardedDataParallel* z : zero_) z->zero_grad();
  }
  const double tokens = count_target_tokens(micro, dp_);
  // Router losses: a mean over every micro-batch of every data-parallel replica (moe/layer.h).
  for (Transformer* c : chunks_) c->set_moe_loss_weight(1.0 / static_cast<double>(micro.size() * dp_.size()));
  double loss;
  {
    AutocastGuard autocast(precision_);
    loss = exec_.run(micro, tokens);
  }
  std::vector<Comm*> sum_over{&pp_};
  if (zero_.empty()) {
    all_reduce_gradients(params_, dp_, expert_dp_);
  } else {
    for (ShardedDataParallel* z : zero_) z->finish();
    sum_over.push_back(&zero_[0]->shard_group());
  }
  StepResult r;
  at::Tensor l = at::tensor({loss}, at::kDouble);
  dp_.all_reduce(l);
  r.loss = l.item<double>();
  r.tokens = static_cast<int64_t>(tokens);
  std::vector<MoeLayer*> moe;
  for (Transformer* c : chunks_) {
    for (MoeLayer* l : c->moe_layers()) moe.push_back(l);
  }
  std::vector<Comm*> saw_apart{&dp_, &pp_};  // the stages hold different layers
  if (chunks_[0]->sequence_parallel()) saw_apart.push_back(&tp_);
  MoeMetrics m = collect_moe_metrics(moe, saw_apart, chunks_[0]->spec());
  r.metrics = std::move(m.values);
  r.expert_tokens = std::move(m.tokens);
  r.grad_norm = opt_.grad_norm(&tp_, sum_over);
  r.dropped = gate && !gate(r.loss, r.grad_norm);
  if (!r.dropped) {
    opt_.update(r.grad_norm);
    for (ShardedDataParallel* z : zero_) z->after_step();
  }
  r.lr = opt_.last_lr();
  return r;
}

}  // namespace meshtrain
