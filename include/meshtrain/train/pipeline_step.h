// One optimizer step of a pipeline-parallel model (parallel/pipeline/executor.h)
// on the dp x tp x pp mesh: the step of train/step.h with the forward and
// backward of all micro-batches run by the pipeline schedule.
//
//   1. gradients zeroed (ZeRO-1: its flat buffers);
//   2. target tokens of the global batch counted (one all-reduce over dp):
//      every micro-batch's loss is divided by it (train/step.h's invariant);
//   3. the executor runs the schedule: gradients accumulate over micro-batches,
//      tied-embedding copies are summed between the first and last stage;
//   4. data-parallel reduction: one flat all-reduce over dp, or ZeRO-1's
//      reduce-scatter per flat (ZeRO-2/3 would reduce-scatter, and stage 3
//      re-gather, once per micro-batch of every stage: refused with pp, as
//      DeepSpeed does);
//      (with expert parallelism the experts' gradients over dp x cp alone);
//   5. tp sums of sequence-partial gradients, clipping by the global norm
//      (sums of squares over tp, pp and ZeRO's shard group; the tied copy on
//      the last stage counted once), AdamW, ZeRO-1's all-gather.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/nn/params.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

class PipelineExecutor;

// Every chunk's parameters in one list (the tensors are shared): what AdamW
// updates without ZeRO.
std::vector<Param> pipeline_params(const std::vector<Transformer*>& chunks);

class PipelineTrainStep {
 public:
  // `zero`: one ZeRO-1 per chunk, or empty. `opt` updates pipeline_params(chunks),
  // or the chunks' ZeRO shard parameters, in chunk order. `expert_dp`: as
  // StepOptions::expert_dp (expert parallelism; null: none).
  PipelineTrainStep(std::vector<Transformer*> chunks, PipelineExecutor& exec, AdamW& opt, Comm& dp, Comm& tp,
                    Comm& pp, std::vector<ShardedDataParallel*> zero = {}, Precision precision = Precision::Fp32,
                    Comm* expert_dp = nullptr);
  // This dp rank's micro-batches of the step (the same list on every pp and tp rank).
  StepResult run(const std::vector<Batch>& micro, const UpdateGate& gate = {});

 private:
  std::vector<Transformer*> chunks_;
  PipelineExecutor& exec_;
  AdamW& opt_;
  Comm& dp_;
  Comm& tp_;
  Comm& pp_;
  std::vector<ShardedDataParallel*> zero_;
  Precision precision_;
  Comm* expert_dp_;
  std::vector<Param> params_;
};

}  // namespace meshtrain
