// `meshtrain diagnose step CKPT --step N`: one training step replayed from a
// checkpoint and looked at through seed 003's layers of loss-spike
// troubleshooting.
//
// The replay runs on this one process: the checkpoint's config (its manifest
// keeps the whole config, as --print-config writes it) on a mesh of 1, which
// loads any checkpoint (train/state.h), reads the same global batch (the
// loader's windows do not depend on the data-parallel size; batches a spike
// rollback dropped are dropped again) and computes the same step up to the
// order of fp32 sums, with the run's own dropout masks (keyed by the step and
// the rows' places in the global batch, model/transformer.h). Steps between
// the checkpoint and N are replayed first.
//
//   data:     the step's windows — distinct tokens, the most frequent ones,
//             windows repeated within the batch, repeated 8-grams, the
//             document pieces' lengths;
//   numerics: per layer the RMS of its output and of that output's gradient,
//             and its parameters' gradient, weight (before the step) and update
//             norms; the first non-finite tensor (layer outputs in forward
//             order, then their gradients in backward order, then parameter
//             gradients), or the
//             first layer whose output RMS grows more than 100x over the
//             layer before (exploding);
//   determinism: the step replayed twice from the checkpoint, compared
//             bitwise (loss, gradient norm, every parameter after the update);
//             the first tensor that differs is named.
// The hardware layer (silent corruption in one replica) needs the run's own
// ranks: [check] replicas_every (train/replica_check.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

class Runtime;

struct LayerDiagnosis {
  std::string name;  // "embed", "layers.3", "final_norm", "head"
  double act_rms = 0, act_grad_rms = 0;  // the layer's output (blocks only; 0 elsewhere)
  double grad = 0, weight = 0, update = 0;  // L2 norms over the layer's parameters (weight: before the update)
};

struct StepDiagnosis {
  std::string checkpoint;
  int64_t from_step = 0, step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  // Data.
  int64_t windows = 0, seq = 0, distinct_tokens = 0;
  std::vector<std::pair<int64_t, double>> top_tokens;  // token, fraction of the batch's tokens
  double repeated_windows = 0, repeated_8grams = 0;    // fractions
  int64_t doc_pieces = 0;
  double doc_mean = 0;
  int64_t doc_min = 0, doc_max = 0;
  // Numerics.
  std::vector<LayerDiagnosis> layers;
  std::string first_nonfinite;  // "" when every tensor is finite
  std::string exploding;        // "" when no layer's output grows > 100x
  // Determinism.
  bool bitwise_equal = true;
  std::string first_difference;  // the first tensor the two replays disagree on
};

// `checkpoint`: a step directory (or a directory of them: the newest).
// Throws std::invalid_argument naming the problem (no config in the
// manifest, a step not after the checkpoint's).
StepDiagnosis diagnose_step(const std::string& checkpoint, int64_t step, Runtime& rt);

std::string diagnosis_text(const StepDiagnosis& d);

}  // namespace meshtrain
