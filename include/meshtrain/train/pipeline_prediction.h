// What the pipeline's cut predicts before a step runs: each stage's matmul work
// and rank 0's idle share of the step (the bubble the trainer measures).
//
// The stages are rarely equal: the last holds the head, whose V x h multiply is
// several layers' worth at a large vocabulary and small hidden size (gpt2-124m:
// about 6 layers). The slowest stage sets the pace, so a step simulated with
// every action's cost in proportion to its stage's work (plan::simulate with
// ActionCosts::stage_scale) predicts the bubble the run measures; the uniform
// (p - 1) / (m + p - 1) does not (33% against the 59% measured for a 6/6 cut of
// gpt2-124m, pp 2, 2 micro-batches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct TrainConfig;

struct PipelinePrediction {
  std::vector<int64_t> layers;  // per (virtual) stage
  std::vector<double> work;     // matmul work per token of each stage, relative to the heaviest
  double bubble = 0;            // rank 0's predicted idle share of the step
};

// The config's own cut (parallel.pp_layers or pp_balance) with `micro_batches` per step.
// Throws std::invalid_argument as plan::build_schedule and plan::partition_layers do.
PipelinePrediction predict_pipeline(const TrainConfig& c, int micro_batches);

// The log's note where a parameter-balanced cut leaves the stages' work unequal enough
// that pp_balance = "compute" predicts a bubble at least 5 points smaller; empty otherwise
// (the user chose the layers, the balance is already compute, the stages are interleaved, or the
// gain is small).
std::string compute_balance_note(const TrainConfig& c, int micro_batches, const PipelinePrediction& own);

}  // namespace meshtrain
