// Internal: ZeRO's state (parallel/data/zero.h) shared by its three files:
// zero.cpp (the flats built, a step's boundaries and the backward's
// reductions), zero_gather.cpp (stage 3: units gathered and freed around their
// use) and zero_slices.cpp (this rank's slices against whole parameters:
// checkpoints, loads, offloaded masters).
#pragma once

#include <ATen/Functions.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/platform/device.h"

namespace meshtrain {
namespace zero_detail {

// Buckets and flats live on the device the parameters do (platform/device.h).
inline at::TensorOptions on_device(at::ScalarType t) { return at::TensorOptions(compute_device()).dtype(t); }

// Offloaded slices (ZeroOptions::offload): host memory, pinned when the device is CUDA, so
// that the copies between them run asynchronously on the device's stream.
inline at::TensorOptions on_host() {
  return at::TensorOptions(at::kCPU).dtype(at::kFloat).pinned_memory(computes_on_cuda());
}

enum class Gathered { No, InFlight, Yes };

struct Flat {
  int64_t unit = 0;
  int decay = 0;
  bool tp_split = false, partial = false, replica = false;
  bool expert = false;           // sharded over ZeroOptions::expert_shard (expert parallelism)
  std::vector<size_t> params;    // model parameter indices
  std::vector<int64_t> offsets;  // of each in the flat
  int64_t numel = 0, padded = 0, shard = 0;
  at::Tensor full;       // [padded]: the parameters are views of it (stage 3: storage freed between uses)
  at::Tensor gather_in;  // stage 3: the slice being gathered (a bf16 copy with bf16_params)
  at::Tensor grad_full;  // stage 1: [padded], the parameters' gradients are views of it
  at::Tensor grad_in;    // stage 2/3: this backward's gradient, until reduced
  at::Tensor grad_out;   // stage 2/3: its reduced slice, in flight
  at::Tensor device_grad;  // offload: the reduced slice on the device (stage 1: a view of grad_full)
  size_t pending = 0;    // parameters whose gradient this backward has not produced yet
  bool launched = false;
  CommWork reduce, gather;
  Gathered gathered = Gathered::Yes;
};

}  // namespace zero_detail

struct ShardedDataParallel::State {
  using Flat = zero_detail::Flat;
  using Gathered = zero_detail::Gathered;
  Transformer& model;
  // The trained parameters (copies of the model's entries: the same tensors),
  // and where each sits among the model's; frozen ones (LoRA's base) are left
  // out of the flats: no gradient, no optimizer state, never sharded.
  std::vector<Param> params;
  std::vector<size_t> model_index;
  Comm& shard;
  Comm& replicate;
  Comm& tp;
  ZeroOptions o;
  std::vector<Flat> flats;
  std::vector<Param> shards;                     // one per flat
  std::map<int64_t, std::vector<size_t>> units;  // unit -> its flats
  std::vector<size_t> flat_of, slot_of;          // per parameter
  std::vector<bool> ready;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  int64_t next_launch = -1, last_launched = -1;  // stage 2/3: flats reduce in descending index
  bool saw_backward = false;
  int64_t gathered_bytes = 0, peak_gathered = 0;
  // The head's unit (UnitHooks), and whether the head reads unit 0's tied embedding: then the
  // head's calls go to unit 0, and on a model with both ends unit 0 stays gathered from the
  // embedding to the head's backward.
  const int64_t head;
  const bool tied, shared_root;

  State(Transformer& m, Comm& s, Comm& r, Comm& t, ZeroOptions opt)
      : model(m), shard(s), replicate(r), tp(t), o(opt), head(head_unit(m.spec().layers)), tied(m.spec().tied),
        shared_root(tied && m.part().embedding && m.part().head) {
    const auto& all = m.params().params();
    for (size_t k = 0; k < all.size(); ++k) {
      if (all[k].frozen) continue;
      params.push_back(all[k]);
      model_index.push_back(k);
    }
  }

  // The group a flat is sharded over: the experts' replicas for an expert flat, else `shard`.
  Comm& group(const Flat& f) const { return f.expert ? *o.expert_shard : shard; }
  int64_t owned_offset(const Flat& f) const { return group(f).rank() * f.shard; }
  // Where flat i's reduced gradient slice accumulates: the shard's .grad, or with offload the
  // device copy that finish() sends down to it.
  at::Tensor& reduced_grad(size_t i) { return o.offload ? flats[i].device_grad : shards[i].tensor.mutable_grad(); }

  void reset_backward();

  // ---- stage 3: gathering and freeing units (zero_gather.cpp) ----
  void start_gather(size_t i, bool async);
  void start_gather_unit(int64_t unit, bool async);
  void ensure_unit(int64_t unit);
  void free_unit(int64_t unit);

  // Where a unit's calls go: the tied head's to unit 0.
  int64_t home(int64_t unit) const { return tied && unit == head ? 0 : unit; }

  // The unit after (forward) or before (backward) `unit` that has flats.
  int64_t neighbour(int64_t unit, int step) const {
    auto it = units.find(unit);
    if (it == units.end()) return -1;
    if (step > 0) return ++it == units.end() ? -1 : it->first;
    return it == units.begin() ? -1 : std::prev(it)->first;
  }

  // ---- stage 2/3: reducing gradients during backward (zero.cpp) ----
  void mark_ready(size_t k);
  void launch_ready();
  void launch(size_t i);
  void complete(size_t i);
};

}  // namespace meshtrain
