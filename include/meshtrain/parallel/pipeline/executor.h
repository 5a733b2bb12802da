// Runs a pipeline schedule (plan/schedule.h) on real ranks: point-to-point
// activations and gradients, autograd per (micro-batch, stage).
//
// - Activation shapes are known from the config ([s(/tp), b, h]): no shape
//   handshake per step.
// - Sends are asynchronous (isend) and waited for at the end of the step, as
//   the schedule checker assumes; receives block until the data is there.
//   Each message has a tag made of (kind, micro-batch, stage), so messages of
//   both directions and kinds between two ranks never get confused.
// - The loss of every micro-batch is divided by the global number of target
//   tokens before backward (train/step.h), so gradients accumulate over the
//   micro-batches to the gradient of the global mean loss.
// - Tied embeddings: the first and last stage each hold embed.weight; after
//   the step their gradients are summed over `embedding_group` (the ranks of
//   stage 0 and stage S-1), so both copies stay identical (Megatron-LM does
//   the same).
// - Split backward (ZB-H1, arXiv 2401.10241): forwards build linears whose
//   weight gradient can wait (nn/linear.h); B runs the stage's backward, which
//   computes input, norm, bias and embedding gradients and records (x, dy) of
//   every linear; W computes their dW = dyᵀ x. The graph is freed after B.
//   With recomputation the re-run inside B builds ordinary nodes: their dW is
//   computed in B (correct, just not deferred).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/data/loader.h"
#include "meshtrain/plan/partition.h"
#include "meshtrain/plan/schedule.h"

namespace meshtrain {

class Comm;
class Runtime;
class MeshLayout;
class Transformer;

// This pipeline rank's model chunks: virtual stages rank, rank + pp, ... of
// pp x v stages partitioned by plan::partition_layers (balanced, or the list).
std::vector<std::unique_ptr<Transformer>> build_stages(const plan::ModelSpec& spec, Comm& tp, bool sequence_parallel,
                                                       uint64_t seed, int pp_rank, int pp, int v,
                                                       const std::vector<int64_t>& layers_per_stage = {},
                                                       plan::Balance balance = plan::Balance::Parameters,
                                                       Comm* ep = nullptr);

// The group of this rank's first and last pipeline stage (same coordinates on
// every other axis), whose tied-embedding copies are summed; null when the
// rank is on neither, or pp = 1. Every rank of the mesh calls it. (Used only
// for tied embeddings: the executor ignores it otherwise.)
std::unique_ptr<Comm> make_embedding_group(Runtime& rt, const MeshLayout& layout);

class PipelineExecutor {
 public:
  // chunks[c]: this rank's virtual stage c * pp + rank (v chunks). `pp`: the
  // pipeline group, rank i = pipeline rank i. `activation`: [s(/tp), b, h].
  PipelineExecutor(const plan::PipelineSchedule& schedule, std::vector<Transformer*> chunks, Comm& pp,
                   std::vector<int64_t> activation, Comm* embedding_group = nullptr);

  // One step over `micro` (all M micro-batches; every rank gets the same list:
  // the first stage reads tokens, the last targets). `tokens`: the global
  // number of target tokens. Returns the summed loss (global mean), on every rank.
  double run(const std::vector<Batch>& micro, double tokens);
  // Forward only (no graph, no dropout), stage after stage: the summed
  // per-token loss of `micro` (not divided), on every rank.
  double evaluate(const std::vector<Batch>& micro);
  // Forward only, one micro-batch: each row's summed per-token loss [b]
  // (double), on every rank (multiple-choice scoring, train/choice_eval.h).
  at::Tensor row_losses(const Batch& b);
  // Off: run() leaves the tp sums of sequence-partial gradients to the caller
  // (ZeRO does them on its slices).
  void set_finalize_grads(bool on) { finalize_ = on; }

  // Seconds this rank spent waiting in receives during the last run (the bubble, measured).
  double last_wait_seconds() const { return wait_s_; }

 private:
  // One micro-batch through this rank's stages, forward only; the last stage hands its per-token loss [s, b]
  // to `on_loss`.
  void forward_only(const Batch& b, const std::function<void(const at::Tensor&)>& on_loss);
  plan::PipelineSchedule s_;
  std::vector<Transformer*> chunks_;
  Comm& pp_;
  std::vector<int64_t> shape_;
  Comm* embed_group_;
  double wait_s_ = 0;
  bool finalize_ = true;
};

}  // namespace meshtrain
