// This rank's slices against whole parameters (parallel/data/zero.h): the ranges a
// checkpoint reads and writes, whole weights and state gathered and sharded again, and
// the offloaded masters kept equal to what the device computes with.
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>

#include "meshtrain/parallel/data/zero.h"
#include "parallel/data/zero_state.h"

namespace meshtrain {

using zero_detail::on_device;
using zero_detail::Flat;
using zero_detail::Gathered;

std::vector<OwnedRange> ShardedDataParallel::owned_ranges() const {
  const State& s = *s_;
  std::vector<OwnedRange> out;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    const Flat& f = s.flats[i];
    const int64_t lo = s.owned_offset(f), hi = lo + f.shard;
    for (size_t j = 0; j < f.params.size(); ++j) {
      const int64_t b = f.offsets[j], e = b + s.params[f.params[j]].tensor.numel();
      if (std::max(b, lo) >= std::min(e, hi)) continue;
      out.push_back({i, s.model_index[f.params[j]], std::max(b, lo) - b, std::min(e, hi) - b, std::max(b, lo) - lo});
    }
  }
  return out;
}

bool ShardedDataParallel::offloaded() const { return s_->o.offload; }

std::vector<at::Tensor> ShardedDataParallel::device_gradients() const {
  std::vector<at::Tensor> out;
  if (!s_->o.offload) return out;
  for (const Flat& f : s_->flats) out.push_back(f.device_grad);
  return out;
}

bool ShardedDataParallel::slices_hold_the_weights() const { return s_->o.stage == 3 || s_->o.bf16_params; }

void ShardedDataParallel::slices_loaded() {
  if (s_->o.stage < 3) after_step();  // bf16 parameters: the device's copies gathered from the fp32 slices
}

void ShardedDataParallel::weights_changed() {
  State& s = *s_;
  if (s.o.bf16_params) {
    throw std::logic_error("zero: with bf16 parameters the fp32 weights are the slices: load into shard_params() and "
                           "call slices_loaded()");
  }
  if (!s.o.offload) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    const Flat& f = s.flats[i];
    s.shards[i].tensor.detach().copy_(f.full.narrow(0, s.owned_offset(f), f.shard));
  }
}

std::vector<at::Tensor> ShardedDataParallel::whole_weights() {
  std::vector<at::Tensor> slices;
  for (const auto& p : s_->shards) slices.push_back(p.tensor.detach());
  std::vector<at::Tensor> out = whole_state(slices);
  const auto& all = s_->model.params().params();
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].frozen) out[k] = all[k].tensor.detach();  // whole on every rank
  }
  return out;
}

void ShardedDataParallel::load_weights(const std::vector<at::Tensor>& whole) {
  State& s = *s_;
  at::NoGradGuard no_grad;
  if (slices_hold_the_weights()) {
    std::vector<at::Tensor> slices;
    for (const auto& p : s.shards) slices.push_back(p.tensor.detach());
    shard_state(whole, slices);
    slices_loaded();
    return;
  }
  // Stages 1 and 2: every rank holds the whole parameters (the slices are views of them); frozen ones too.
  auto& all = s.model.params().params();
  for (size_t k = 0; k < all.size(); ++k) all[k].tensor.detach().copy_(whole.at(k));
  weights_changed();
}

std::vector<at::Tensor> ShardedDataParallel::whole_state(const std::vector<at::Tensor>& flat_state) {
  State& s = *s_;
  std::vector<at::Tensor> out(s.model.params().params().size());  // frozen entries stay undefined
  for (size_t i = 0; i < s.flats.size(); ++i) {
    const Flat& f = s.flats[i];
    at::Tensor whole = at::empty({f.padded}, on_device(at::kFloat));
    s.group(s.flats[i]).all_gather(whole, flat_state.at(i).to(whole.device()));  // offloaded state: host
    for (size_t j = 0; j < f.params.size(); ++j) {
      const at::Tensor& t = s.params[f.params[j]].tensor;
      out[s.model_index[f.params[j]]] = whole.narrow(0, f.offsets[j], t.numel()).view(t.sizes());
    }
  }
  return out;
}

void ShardedDataParallel::shard_state(const std::vector<at::Tensor>& whole, std::vector<at::Tensor>& flat_state) {
  State& s = *s_;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    const Flat& f = s.flats[i];
    at::Tensor buf = at::zeros({f.padded}, on_device(at::kFloat));
    for (size_t j = 0; j < f.params.size(); ++j) {
      const at::Tensor& w = whole.at(s.model_index[f.params[j]]);
      buf.narrow(0, f.offsets[j], w.numel()).copy_(w.reshape({-1}));
    }
    flat_state.at(i).copy_(buf.narrow(0, s.owned_offset(f), f.shard));
  }
}

}  // namespace meshtrain
