// One optimizer step: gradient accumulation over micro-batches, data-parallel
// gradient reduction, tensor-parallel finalisation, clipping and AdamW.
//
// Invariant (DESIGN.md): the loss is normalised by the number of target tokens
// in the whole global batch — every micro-batch on every data-parallel rank —
// counted once before the step with one all-reduce. Each token's loss is
// divided by that count, so the summed gradients over ranks and micro-batches
// are exactly the gradient of the global mean loss, whatever the split and
// however many targets each micro-batch ignores. (A mean per micro-batch or per
// rank would weight tokens unequally.)
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/loader.h"

namespace meshtrain {

class AdamW;
class Comm;
class Transformer;

struct StepResult {
  double loss = 0;       // global mean loss per target token
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t tokens = 0;    // target tokens in the global batch
};

class TrainStep {
 public:
  // `dp`: the group gradients are reduced over (data parallel x context
  // parallel); `tp`: the model's tensor-parallel group.
  TrainStep(Transformer& model, AdamW& opt, Comm& dp, Comm& tp) : model_(model), opt_(opt), dp_(dp), tp_(tp) {}
  // This rank's micro-batches of the step.
  StepResult run(const std::vector<Batch>& micro_batches);

 private:
  void reduce_gradients();
  Transformer& model_;
  AdamW& opt_;
  Comm& dp_;
  Comm& tp_;
};

}  // namespace meshtrain
