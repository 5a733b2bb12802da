// What a training checkpoint holds, and how it maps onto a model on any mesh.
//
// Tensors (global names; each rank saves the box of the global tensor it holds):
//   model/<param>               the parameters (names: model/transformer.h)
//   optim/exp_avg/<param>       AdamW first moment, fp32
//   optim/exp_avg_sq/<param>    AdamW second moment, fp32
// No random state: dropout masks are keyed by the step and the data (model/transformer.h), so a
// resume on any mesh drops what the uninterrupted run drops. (Checkpoints written before that
// hold rng/dropout_* tensors, which nothing reads.)
// Replicas are written by one rank only: one data-parallel replica per
// parameter, the replicas sharing the writing (under ZeRO every shard rank of
// the first replica writes its slices), and for parameters replicated across
// tp, tp rank 0.
// Manifest fields: config.model (the ModelSpec), config.train, mesh, optimizer
// (steps), loader (epoch, windows of the epoch consumed: independent of the
// data-parallel size, so a run resumes on another mesh at the same sample).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/parallel/data/owned_range.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/spec_json.h"

namespace meshtrain {

class AdamW;
class Transformer;

// This rank's pieces of the model and optimizer state.
std::vector<ckpt::Piece> training_pieces(Transformer& model, const AdamW* opt, int dp_rank);
// The same with the moments given per model parameter. An undefined moment
// (a frozen parameter: no optimizer state) is not written. `dp_rank`: this
// rank among the `dp_size` replicas of the dense parameters; `expert_dp_rank`
// among the `expert_dp_size` of its experts (dp x cp, without ep; -1: dp_rank).
// The replicas share the writing: each parameter (with its moments) is written
// by one of them, balanced by elements (state.cpp, replica_writers).
std::vector<ckpt::Piece> training_pieces(Transformer& model, const std::vector<at::Tensor>& exp_avg,
                                         const std::vector<at::Tensor>& exp_avg_sq, int dp_rank,
                                         int expert_dp_rank = -1, int dp_size = 1, int expert_dp_size = 1);

// A ZeRO rank's state (parallel/data/zero.h): its fp32 weight slices and
// moment slices, one per flat, and where they sit in the model.
struct ZeroSlices {
  std::vector<OwnedRange> ranges;
  std::vector<at::Tensor> weights, exp_avg, exp_avg_sq;  // per flat; empty: not read (load_zero_slices)
  bool replica_lead = true;  // the first HSDP replica writes
};
// Its pieces without gathering: each owned range as its boxes of the
// parameter (ckpt/flat_boxes.h) in global coordinates, views of the slices;
// frozen parameters (whole on every rank) as training_pieces.
// The checkpoint is the one DDP writes, cut into smaller shards.
std::vector<ckpt::Piece> zero_pieces(Transformer& model, const ZeroSlices& z, int dp_rank);
// The reverse, on any mesh: reads each owned range's boxes straight into the
// slices (the reader streams the overlapping shards, checkpoint.h), so loading
// holds no more than this rank's state and the reader's staging buffer.
// Adapters the checkpoint lacks keep their values.
void load_zero_slices(ckpt::Reader& r, Transformer& model, const ZeroSlices& z);

// Loads the parameters (and, when `opt` is given, the moments) of this rank's
// shards, whatever mesh wrote them. The checkpoint's model must equal the
// model's spec up to vocabulary padding (std::runtime_error names the field).
// LoRA and bottleneck adapters the checkpoint does not hold keep their fresh
// values (B = 0, up = 0): fine-tuning starts from a base model's checkpoint.
void load_model(ckpt::Reader& r, Transformer& model);
// Throws std::runtime_error naming the field when the checkpoint's model shape
// (layers, hidden, heads, kv heads, ffn, vocab) differs from `now`.
void check_same_model(const ckpt::Reader& r, const plan::ModelSpec& now);
// The same into `into` (one tensor per parameter, its shape) instead.
void load_model(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& into);
// [init] from: the checkpoint's model as a starting point. A checkpoint
// trained with LoRA starts its successor from the merged model: W + (alpha /
// rank) B A into the base weights (the manifest's "lora" settings), and the
// model's own adapters, if any, start fresh (B = 0); so SFT with LoRA, then DPO
// with new adapters, starts (and references) the SFT model. Everything else as
// load_model.
void load_initial_weights(ckpt::Reader& r, Transformer& model);
void load_initial_weights(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& into);
void load_optimizer(ckpt::Reader& r, Transformer& model, AdamW& opt);
// The moments per model parameter (this rank's tp shard), for ZeRO to slice;
// undefined entries (frozen parameters) and adapters the checkpoint lacks are skipped.
void load_moments(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& exp_avg,
                  std::vector<at::Tensor>& exp_avg_sq);

}  // namespace meshtrain
