// ZeRO-3's units gathered before their use and freed after it (parallel/data/zero.h).
#include <ATen/Functions.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <iterator>

#include "meshtrain/parallel/data/zero.h"
#include "parallel/data/zero_state.h"

namespace meshtrain {
namespace {

using zero_detail::Flat;
using zero_detail::Gathered;

// Stage 3 frees and reallocates a flat's storage in place: every tensor that
// shares it (the parameters, views saved by autograd) follows.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t, int64_t numel) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(numel) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace

void ShardedDataParallel::State::start_gather(size_t i, bool async) {
  Flat& f = flats[i];
  if (f.gathered != Gathered::No) return;
  allocate_storage(f.full, f.padded);
  gathered_bytes += f.full.storage().nbytes();
  peak_gathered = std::max(peak_gathered, gathered_bytes);
  f.gather_in = shards[i].tensor.detach().to(f.full.scalar_type());
  // Broadcast-based gathers run in the background (comm.h); Auto (shared memory on one host, else the
  // ring for large gathers) completes within the call.
  f.gather = group(f).all_gather_async(f.full, f.gather_in, async ? GatherAlgo::Broadcast : GatherAlgo::Auto);
  f.gathered = Gathered::InFlight;
}

void ShardedDataParallel::State::start_gather_unit(int64_t unit, bool async) {
  auto it = units.find(unit);
  if (it == units.end()) return;
  for (size_t i : it->second) start_gather(i, async);
}

void ShardedDataParallel::State::ensure_unit(int64_t unit) {
  auto it = units.find(unit);
  if (it == units.end()) return;
  for (size_t i : it->second) {
    start_gather(i, false);
    Flat& f = flats[i];
    if (f.gathered == Gathered::InFlight) f.gather.wait();
    f.gathered = Gathered::Yes;
    f.gather_in = at::Tensor();
  }
}

void ShardedDataParallel::State::free_unit(int64_t unit) {
  auto it = units.find(unit);
  if (it == units.end()) return;
  for (size_t i : it->second) {
    Flat& f = flats[i];
    if (f.gathered == Gathered::No) continue;
    if (f.gathered == Gathered::InFlight) f.gather.wait();
    gathered_bytes -= f.full.storage().nbytes();
    free_storage(f.full);
    f.gather_in = at::Tensor();
    f.gathered = Gathered::No;
  }
}

void ShardedDataParallel::gather_params() {
  if (s_->o.stage != 3) return;
  for (const auto& [unit, members] : s_->units) s_->ensure_unit(unit);
}

void ShardedDataParallel::release_params() {
  if (s_->o.stage != 3) return;
  for (const auto& [unit, members] : s_->units) s_->free_unit(unit);
}

int64_t ShardedDataParallel::peak_gathered_bytes() const { return s_->peak_gathered; }

void ShardedDataParallel::before_unit(int64_t unit) {
  State& s = *s_;
  s.ensure_unit(s.home(unit));
  const int64_t next = s.neighbour(unit, +1);  // none after the head
  if (s.o.prefetch && next >= 0) s.start_gather_unit(next, true);
}

at::Tensor ShardedDataParallel::after_unit(int64_t unit, const at::Tensor& out) {
  State& s = *s_;
  if (unit == 0) {
    // The embedding: a lookup's (and the positions') backward reads no weight, so it goes now,
    // unless the tied head reads it still.
    if (!s.shared_root) s.free_unit(0);
    return out;
  }
  if (unit == s.head) {
    // The head's backward comes first: it stays gathered until its gradients are reduced
    // (launch()), or goes now without backward.
    if (!out.requires_grad()) s.free_unit(s.home(unit));
    return out;
  }
  if (out.requires_grad()) {
    // Runs when the gradient of the unit's output is ready: before the unit's backward.
    State* st = &s;
    out.register_hook([st, unit](const at::Tensor&) {
      st->ensure_unit(unit);
      const int64_t prev = st->neighbour(unit, -1);
      if (st->o.prefetch && prev > 0) st->start_gather_unit(prev, true);
    });
  }
  s.free_unit(unit);
  return out;
}

}  // namespace meshtrain
