// One optimizer step: gradient accumulation over micro-batches, data-parallel
// gradient reduction, tensor-parallel finalisation, clipping and AdamW.
//
// Invariant (DESIGN.md): the loss is normalised by the number of target tokens
// in the whole global batch — every micro-batch on every data-parallel rank —
// counted once before the step with one all-reduce. Each token's loss is
// divided by that count, so the summed gradients over ranks and micro-batches
// are exactly the gradient of the global mean loss, whatever the split and
// however many targets each micro-batch ignores. (A mean per micro-batch or per
// rank would weight tokens unequally.) Another method's objective (train/
// objective.h) keeps the invariant with its own units: DPO's pairs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/data/loader.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/train/precision.h"

namespace meshtrain {

class AdamW;
class DataParallel;
class ShardedDataParallel;
class LossScaler;
class Comm;
class Objective;
class Transformer;

struct StepResult {
  double loss = 0;       // global mean loss per target token
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t tokens = 0;    // target tokens in the global batch (the objective's units)
  // The objective's, means over the global batch; then with MoE layers
  // moe/metrics.h's, whose tokens per expert (per layer) are `expert_tokens`.
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<std::vector<double>> expert_tokens;
  bool skipped = false;  // the loss scaler found inf/NaN gradients: no update
  bool dropped = false;  // the update gate refused the update (train/spike.h): no update
  double loss_scale = 1;
};

// Asked with the step's global loss and gradient norm (the same on every
// rank) before the optimizer updates anything: false drops the update. Empty:
// always update.
using UpdateGate = std::function<bool(double loss, double grad_norm)>;

struct StepOptions {
  Precision precision = Precision::Fp32;  // forward under autocast for bf16/fp16
  LossScaler* scaler = nullptr;           // required for fp16, optional otherwise
  DataParallel* ddp = nullptr;            // bucketed, overlapped reduction; null: one flat all-reduce after backward
  // ZeRO / FSDP instead of ddp: the optimizer must update zero->shard_params().
  ShardedDataParallel* zero = nullptr;
  Objective* objective = nullptr;  // null: next-token loss (pretraining, SFT)
  // Expert parallelism: the experts' gradients (Param::expert) are reduced
  // over this group (the ranks holding the same experts: dp x cp) and by
  // ddp_experts; the rest over the step's dp (dp x cp x ep) and by ddp.
  // Null: every gradient over dp.
  Comm* expert_dp = nullptr;
  DataParallel* ddp_experts = nullptr;
};

// Target tokens (targets >= 0) of the global batch: this rank's micro-batches
// summed over `dp`. Throws when there are none.
double count_target_tokens(const std::vector<Batch>& micro_batches, Comm& dp);
// Sums (not averages) every gradient over `dp` in fp32 as one flat buffer;
// missing gradients count as zeros. With `expert_dp`, the experts' gradients
// are summed over it instead (a second flat buffer).
void all_reduce_gradients(std::vector<Param>& params, Comm& dp, Comm* expert_dp = nullptr);

class TrainStep {
 public:
  // `dp`: the group gradients are reduced over (data parallel x context
  // parallel); `tp`: the model's tensor-parallel group.
  TrainStep(Transformer& model, AdamW& opt, Comm& dp, Comm& tp, StepOptions o = {});
  // This rank's micro-batches of the step.
  StepResult run(const std::vector<Batch>& micro_batches, const UpdateGate& gate = {});

 private:
  Transformer& model_;
  AdamW& opt_;
  Comm& dp_;
  Comm& tp_;
  StepOptions o_;
};

}  // namespace meshtrain
