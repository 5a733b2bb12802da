// LoRA (Hu et al., arXiv 2106.09685): a frozen linear W gains a trainable
// low-rank update,
//   y = x Wᵀ + (α / r) · dropout(x) Aᵀ Bᵀ,   A [r, in], B [out, r],
// with A drawn like PEFT's Kaiming-uniform (here N(0, 1 / (3 in)), the same
// variance) and B = 0, so training starts from exactly the base model.
//
// Under tensor parallelism an adapter is cut like its base linear (as in
// NeMo's LoRA for Megatron layers):
//   column-parallel base (W split on out): A whole, B split on out. Each rank's
//     dA covers only its slice of the outputs: A's gradient is partial over tp.
//   row-parallel base (W split on in): A split on in, B whole; the low-rank
//     term is added to the partial product before the row region's reduction,
//     so the tp sum covers it. B's gradient is partial over tp.
// The partial gradients are marked Param::sequence_partial, which
// Transformer::finalize_grads sums over the tp group.
//
// Every parameter that is not an adapter is frozen (requires_grad false,
// Param::frozen): optimizers skip it and checkpoints of adapters leave it out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/parallel/tensor/linear_addons.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain {

class Transformer;

struct LoraOptions {
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0;
  // Linears whose name ("layers.3.attn.q", "layers.0.mlp.fc2", ...) contains
  // one of these; an empty list or "all" adapts every linear of the blocks.
  std::vector<std::string> targets{"attn.q", "attn.v"};
};

struct LoraAdapter final : LinearDelta {
  at::Tensor a, b;  // this rank's shards
  double scale = 1;  // α / r
  double dropout = 0;
  // Dropout masks are the model's keyed ones (model/transformer.h) at site `site` (the linear's
  // name), over [s, b, in] with this rank's inputs from `feature_offset` (row-parallel: tp rank x in / tp).
  const Transformer* model = nullptr;
  uint64_t site = 0;
  int64_t feature_offset = 0;
  bool enabled = true;           // false: the base alone (a DPO reference without a second copy)
  bool merged = false;           // (α / r) B A is in W (merge_lora): not added again
  bool active() const override { return enabled && !merged; }
  // (α / r) · dropout(x) Aᵀ Bᵀ; dropout only when `train`.
  at::Tensor delta(const at::Tensor& x, bool train) const override;
};

// The names of a model's block linears, as Transformer::linears() gives them
// ("layers.L.attn.q", ...): what LoRA targets are matched against.
std::vector<std::string> linear_names(const plan::ModelSpec& m);
// Throws std::invalid_argument (as apply_lora would, on every rank) when the
// options are out of range or no linear matches the targets: for the launching process.
void check_lora(const plan::ModelSpec& m, const LoraOptions& o);

// Adds an adapter to every targeted linear of `m` and freezes the rest.
// Returns the adapted linears' names; throws std::invalid_argument when none
// matches or the options are out of range.
std::vector<std::string> apply_lora(Transformer& m, const LoraOptions& o);

// W += (α / r) B A in every adapted linear (this rank's shards), after which
// the adapter adds nothing; unmerge subtracts it again. Each is a no-op on an
// adapter already in that state.
void merge_lora(Transformer& m);
void unmerge_lora(Transformer& m);

// Turns every adapter on or off without touching W (the base model's outputs
// with `false`: DPO's reference without a second copy).
void enable_lora(Transformer& m, bool on);

}  // namespace meshtrain
