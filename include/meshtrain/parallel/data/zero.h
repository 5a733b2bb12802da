// ZeRO (Rajbhandari et al., arXiv 1910.02054) and FSDP-style sharding of the
// training state over the data-parallel group, with HSDP (shard within a
// group, replicate across groups).
//
// The parameters are packed into flat fp32 buffers ("flats"): one per unit and
// per optimizer class, where a unit is a layer (unit i + 1 for layer i), the
// embedding with the positions (unit 0) or the final norm with the head (unit
// L + 1; with tied embeddings they join unit 0: the head reads its weight), the
// class is (weight decay?, tensor-parallel split?, sequence-partial gradient?),
// so that every flat updates under one rule. A flat of `numel` elements is
// padded to `padded` = a multiple of N (the shard group's size); rank r owns
// elements [r S, (r + 1) S), S = padded / N. The model's parameters are views
// into their flat (set once, at construction).
//
//   stage 1  optimizer states sharded. Gradients accumulate whole in a flat
//            gradient buffer (the parameters' .grad are views of it); after
//            the last backward each flat is reduce-scattered and the owned
//            slice is updated; the flat is then all-gathered.
//   stage 2  + gradients sharded. During every backward, a flat's gradient is
//            reduce-scattered as soon as its last parameter's gradient is
//            accumulated, added to the owned gradient slice, and the whole
//            gradients are freed.
//   stage 3  + parameters sharded (FSDP). A flat's storage is allocated and
//            all-gathered before its unit's forward and freed after it, then
//            gathered again before the unit's backward (a hook on the unit's
//            output gradient) and freed once its gradients are reduced. The
//            next unit's gather is started (prefetched) while the current one
//            computes: the following layer in forward, the preceding one in
//            backward. The embedding is freed after its forward (a lookup's
//            backward reads no weight) and not gathered again; the head stays
//            gathered from its forward until its gradients are reduced, at the
//            start of backward. So the most gathered at once is two adjacent
//            units (measured by peak_gathered_bytes). A tied model's unit 0
//            stays gathered from the embedding to the end of backward.
//
// Invariants:
// - Every rank issues the same collectives in the same order on the shard
//   group: forward gathers units in order, backward reduces flats in
//   descending index (reverse registration, the order backward produces
//   them), a flat waiting for its predecessors even when ready first.
// - Storage, not tensors, is freed in stage 3: views the autograd graph saved
//   (w.t() in a linear) share the flat's storage and see the regathered data.
// - Gradients are sums over ranks (the loss is already divided by the global
//   token count, train/step.h). With HSDP the reduced shard is then
//   all-reduced over the replica group, and replicas take identical steps.
// - Padding elements hold zero weights and get zero gradients, so AdamW leaves
//   them at zero.
//
// The model belongs to the wrapper while it lives: its parameters are views
// of the flats (stage 3: of freed storage between uses), and a stage 3 model
// must not be run after the wrapper is gone.
//
// Frozen parameters (Param::frozen: a base under LoRA or adapters) stay out of
// the flats in stages 1 and 2: whole on every rank, no gradient, no optimizer
// state; stage 3 refuses a model that has them.
//
// Memory per rank (fp32, Ψ parameters, N shard ranks): stage 1 8Ψ + 8Ψ/N,
// stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N plus the gathered units in flight
// (train/memory.h). Checkpoints hold each rank's slices as boxes of the
// parameters (owned_ranges, ckpt/flat_boxes.h) in the global coordinates DDP
// writes, so a run resumes under any stage on any mesh without a gather.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/parallel/data/owned_range.h"

namespace meshtrain {

class Comm;
class Runtime;
struct AdamWOptions;

struct ZeroOptions {
  int stage = 1;             // 1, 2 or 3
  bool find_unused = false;  // stage 2/3: a parameter without gradient counts as zero instead of an error
  bool prefetch = true;      // stage 3: gather the next unit while this one computes
  // Stage 3 in bf16 mode: the fp32 shards are gathered as bf16 copies (half
  // the bytes on the wire and in memory) and the model computes with bf16
  // weights (FSDP's param_dtype = bf16); gradients are reduced in fp32.
  // Stages 1 and 2 with offload: the device holds bf16 parameters (and stage
  // 1 bf16 gradients, reduced in bf16), the fp32 masters are the host slices,
  // and after_step() gathers their bf16 casts (ZeRO-Offload's 16-bit weights
  // copied back). Stage 2 then computes what stage 3 in bf16 computes.
  bool bf16_params = false;
  // Expert parallelism (moe/layer.h): the experts' parameters (Param::expert)
  // go into flats of their own, sharded over this group (the ranks holding the
  // same experts, dp x cp) while the rest shard over the shard group (dp x cp
  // x ep). Every slice of either kind is then disjoint across the shard group,
  // so the gradient norm sums over it alone. Null: one group for all.
  Comm* expert_shard = nullptr;
  // ZeRO-Offload (Ren et al., USENIX ATC'21, arXiv 2101.06840), stages 1 and 2:
  // this rank's fp32 master slices, their reduced gradients and (AdamW
  // allocates its moments like its parameters) the Adam moments live in host
  // memory, pinned when the flats are on CUDA, and AdamW steps there (the
  // fused CPU update, on ATen's threads). finish() copies each flat's reduced
  // slice down as soon as it is final; after_step() sends the updated slices
  // up as the all-gather's inputs. On cpu the "host" copies are a second host
  // buffer: the same code path, tested here; the trainer refuses it there.
  bool offload = false;
};

// HSDP's two groups, cut from the data-parallel group `dp` (group order):
// shard = consecutive blocks of `shard_size` ranks, replicate = the ranks with
// the same position in every block. shard_size = dp.size(): plain ZeRO.
struct ShardGroups {
  std::unique_ptr<Comm> shard, replicate;
};
ShardGroups make_shard_groups(Runtime& rt, Comm& dp, int shard_size);

class ShardedDataParallel : public UnitHooks {
 public:
  // Broadcasts the parameters from rank 0 of the shard and replica groups,
  // packs them into flats and, for stage 3, installs itself as the model's
  // unit hooks. `decay` decides which parameters get weight decay.
  ShardedDataParallel(Transformer& model, Comm& shard, Comm& replicate, Comm& tp, const AdamWOptions& decay,
                      ZeroOptions o = {});
  ~ShardedDataParallel() override;

  int stage() const;
  Comm& shard_group();
  // This rank's slices, one per flat: what AdamW updates (their .grad is the
  // reduced gradient slice after finish()). With offload, host tensors.
  std::vector<Param>& shard_params();
  bool offloaded() const;
  // With offload: the device's reduced gradient slices, one per flat, that finish() copies down
  // (stage 1: views of the whole gradients); empty otherwise (for memory accounting).
  std::vector<at::Tensor> device_gradients() const;
  // With offload, after the model's parameters were written in place (a
  // checkpoint's load): the host master slices are read again from them.
  // Invariant: between steps the host masters equal the device's owned slices.
  void weights_changed();
  // Where a checkpoint's weights are read: true when the slices are the only
  // fp32 copy (stage 3; bf16 parameters): into shard_params(), then
  // slices_loaded() (stages 1/2: gathers the device's bf16 copies from them).
  // False: into the model's parameters, then weights_changed().
  bool slices_hold_the_weights() const;
  void slices_loaded();

  // Before a step's first backward: zero gradients.
  void zero_grad();
  // After every backward (each micro-batch): stages 2 and 3 reduce what is
  // left of this backward's gradients, wait for the reductions and free the
  // gathered units; throws naming the parameters that got no gradient
  // (unless find_unused: then they count as zero).
  void after_backward();
  // After the step's last backward: reduced, tp-finalised gradient slices.
  void finish();
  // After the optimizer step: stages 1 and 2 all-gather the updated slices
  // into the parameters.
  void after_step();

  // Stage 3: gather_params() makes every parameter whole (to read it, e.g.
  // for an export), release_params() frees them again. No-ops otherwise.
  void gather_params();
  void release_params();

  // Where this rank's slices (shard_params()[flat], and any per-flat state
  // such as AdamW::exp_avg()) sit in the model; padding is in no range.
  // Checkpoints write and read exactly these ranges (train/state.h), so no
  // rank gathers another's state to save or load.
  std::vector<OwnedRange> owned_ranges() const;

  // Whole tensors per model parameter (fp32, the parameter's shape), gathered
  // from the slices over the shard group: the fp32 weights, and any per-flat
  // state. And the reverse (for loading a LoRA merge at init). Frozen
  // parameters (not in the flats) are whole in whole_weights, undefined in
  // whole_state, copied as they are by load_weights and skipped by shard_state.
  std::vector<at::Tensor> whole_weights();
  void load_weights(const std::vector<at::Tensor>& whole);
  std::vector<at::Tensor> whole_state(const std::vector<at::Tensor>& flat_state);
  void shard_state(const std::vector<at::Tensor>& whole, std::vector<at::Tensor>& flat_state);

  // Flats (for tests and the log): units' padded sizes and names.
  size_t flats() const;
  int64_t padded_numel() const;       // Σ padded over flats
  int64_t padded_numel(int64_t unit) const;  // Σ padded over a unit's flats (the tied head's: unit 0's)
  int64_t peak_gathered_bytes() const;  // stage 3: most gathered bytes allocated at once

  // UnitHooks (stage 3).
  void before_unit(int64_t unit) override;
  at::Tensor after_unit(int64_t unit, const at::Tensor& out) override;

  struct State;  // parallel/data/zero_state.h

 private:
  std::unique_ptr<State> s_;
};

}  // namespace meshtrain
