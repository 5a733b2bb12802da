#include "meshtrain/parallel/data/zero.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "meshtrain/comm/comm.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/runtime/runtime.h"
#include "parallel/data/grad_ready.h"

namespace meshtrain {
namespace {

// Buckets and flats live on the device the parameters do (platform/device.h).
at::TensorOptions on_device(at::ScalarType t) { return at::TensorOptions(compute_device()).dtype(t); }

// Offloaded slices (ZeroOptions::offload): host memory, pinned when the device is CUDA, so
// that the copies between them run asynchronously on the device's stream.
at::TensorOptions on_host() {
  return at::TensorOptions(at::kCPU).dtype(at::kFloat).pinned_memory(computes_on_cuda());
}

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

// The units of model/transformer.h's UnitHooks: "layers.{i}.…" -> i + 1; the
// final norm, head and value head -> `head` (L + 1, or 0 when the head reads the
// tied embedding); the rest (embedding, positions) -> 0.
int64_t unit_of(const std::string& name, int64_t head) {
  const std::string prefix = "layers.";
  for (const char* h : {"final_norm.", "head.", "value_head."}) {
    if (name.rfind(h, 0) == 0) return head;
  }
  if (name.rfind(prefix, 0) != 0) return 0;
  const size_t end = name.find('.', prefix.size());
  return std::stoll(name.substr(prefix.size(), end - prefix.size())) + 1;
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

}  // namespace

ShardGroups make_shard_groups(Runtime& rt, Comm& dp, int shard_size) {
  const int n = dp.size();
  if (shard_size < 1 || n % shard_size != 0) {
    throw std::invalid_argument(fmt::format("parallel.dp_shard = {} must divide the data-parallel size {} (HSDP shards "
                                            "within groups of dp_shard ranks and replicates across them)",
                                            shard_size, n));
  }
  const int me = dp.rank(), block = me / shard_size, pos = me % shard_size;
  std::vector<int> shard, replicate;
  for (int i = 0; i < shard_size; ++i) shard.push_back(dp.ranks()[block * shard_size + i]);
  for (int b = 0; b < n / shard_size; ++b) replicate.push_back(dp.ranks()[b * shard_size + pos]);
  ShardGroups g;
  g.shard = rt.new_group(shard, dp.name() + "_shard");
  g.replicate = rt.new_group(replicate, dp.name() + "_replicate");
  return g;
}

struct ShardedDataParallel::State {
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

  void reset_backward() {
    for (auto& f : flats) {
      f.pending = f.params.size();
      f.launched = false;
    }
    ready.assign(params.size(), false);
    next_launch = static_cast<int64_t>(flats.size()) - 1;
    last_launched = -1;
  }

  // ---- stage 3: gathering and freeing units ----

  void start_gather(size_t i, bool async) {
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

  void start_gather_unit(int64_t unit, bool async) {
    auto it = units.find(unit);
    if (it == units.end()) return;
    for (size_t i : it->second) start_gather(i, async);
  }

  void ensure_unit(int64_t unit) {
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

  void free_unit(int64_t unit) {
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

  // Where a unit's calls go: the tied head's to unit 0.
  int64_t home(int64_t unit) const { return tied && unit == head ? 0 : unit; }

  // The unit after (forward) or before (backward) `unit` that has flats.
  int64_t neighbour(int64_t unit, int step) const {
    auto it = units.find(unit);
    if (it == units.end()) return -1;
    if (step > 0) return ++it == units.end() ? -1 : it->first;
    return it == units.begin() ? -1 : std::prev(it)->first;
  }

  // ---- stage 2/3: reducing gradients during backward ----

  void mark_ready(size_t k) {
    saw_backward = true;
    if (ready[k]) return;  // a second accumulation in the same backward: already counted
    ready[k] = true;
    Flat& f = flats[flat_of[k]];
    at::Tensor& g = params[k].tensor.mutable_grad();
    if (!f.grad_in.defined()) f.grad_in = at::zeros({f.padded}, on_device(at::kFloat));
    f.grad_in.narrow(0, f.offsets[slot_of[k]], g.numel()).copy_(g.reshape({-1}));
    g = at::Tensor();  // the whole gradient lives in the flat until it is reduced
    f.pending -= 1;
    launch_ready();
  }

  void launch_ready() {
    while (next_launch >= 0 && flats[next_launch].pending == 0) launch(next_launch--);
  }

  void launch(size_t i) {
    Flat& f = flats[i];
    if (!f.grad_in.defined()) f.grad_in = at::zeros({f.padded}, on_device(at::kFloat));
    f.grad_out = at::empty({f.shard}, on_device(at::kFloat));
    f.reduce = group(f).reduce_scatter_async(f.grad_out, f.grad_in);
    f.launched = true;
    if (last_launched >= 0) complete(last_launched);  // at most two reductions in flight
    last_launched = static_cast<int64_t>(i);
    if (o.stage == 3) {
      const auto& members = units.at(f.unit);
      if (std::all_of(members.begin(), members.end(), [&](size_t j) { return flats[j].launched; })) free_unit(f.unit);
    }
  }

  void complete(size_t i) {
    Flat& f = flats[i];
    if (!f.grad_out.defined()) return;
    f.reduce.wait();
    if (replicate.size() > 1) replicate.all_reduce(f.grad_out);
    reduced_grad(i).add_(f.grad_out);
    f.grad_in = at::Tensor();
    f.grad_out = at::Tensor();
  }
};

ShardedDataParallel::ShardedDataParallel(Transformer& model, Comm& shard, Comm& replicate, Comm& tp,
                                         const AdamWOptions& decay, ZeroOptions o)
    : s_(std::make_unique<State>(model, shard, replicate, tp, o)) {
  State& s = *s_;
  if (o.bf16_params && o.stage != 3 && !o.offload) {
    throw std::invalid_argument(fmt::format("zero: bf16 parameters on the device need stage 3 (bf16 copies gathered "
                                            "from fp32 shards) or offload (the fp32 masters are the host slices); "
                                            "stage {} without offload keeps whole fp32 parameters",
                                            o.stage));
  }
  if (o.stage < 1 || o.stage > 3) {
    throw std::invalid_argument(fmt::format("parallel.zero = {}: ZeRO stages are 1 (optimizer states), 2 (+ gradients) "
                                            "and 3 (+ parameters); 0 is plain DDP",
                                            o.stage));
  }
  if ((o.stage == 3 || o.bf16_params) && s.params.size() != model.params().params().size()) {
    throw std::invalid_argument("zero: stage 3 shards every parameter, and this model has frozen ones (adapters on a "
                                "frozen base); use stage 1 or 2, which leave the frozen base whole and untouched");
  }
  if (o.offload && o.stage == 3) {
    throw std::invalid_argument("zero: optimizer offload is built for stages 1 and 2 (ZeRO-Offload); stage 3 shards "
                                "the parameters on the device as well: use parallel.zero = 1 or 2 with offload");
  }
  if (o.expert_shard && replicate.size() > 1) {
    throw std::invalid_argument("zero: expert parallelism with HSDP (parallel.dp_shard) is not supported; set "
                                "parallel.dp_shard = 0");
  }
  // Flats: one per (unit, class), ordered by unit, then by first appearance.
  std::map<std::tuple<int64_t, int, bool, bool, bool, bool>, size_t> index;
  for (size_t k = 0; k < s.params.size(); ++k) {
    const Param& p = s.params[k];
    if (p.tensor.scalar_type() != at::kFloat) {
      throw std::invalid_argument(fmt::format("zero: parameter {} is {}, expected fp32 (master weights)", p.name,
                                              c10::toString(p.tensor.scalar_type())));
    }
    const auto key = std::make_tuple(unit_of(p.name, s.tied ? 0 : s.head), decays(p, decay) ? 1 : 0, p.tp_dim >= 0,
                                     p.sequence_partial, p.replica, p.expert && o.expert_shard);
    auto [it, fresh] = index.emplace(key, s.flats.size());
    if (fresh) {
      s.flats.emplace_back();
      Flat& f = s.flats.back();
      std::tie(f.unit, f.decay, f.tp_split, f.partial, f.replica, f.expert) = key;
    }
    s.flats[it->second].params.push_back(k);
  }
  std::stable_sort(s.flats.begin(), s.flats.end(), [](const Flat& a, const Flat& b) { return a.unit < b.unit; });
  s.flat_of.assign(s.params.size(), 0);
  s.slot_of.assign(s.params.size(), 0);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    Flat& f = s.flats[i];
    s.units[f.unit].push_back(i);
    for (size_t j = 0; j < f.params.size(); ++j) {
      s.flat_of[f.params[j]] = i;
      s.slot_of[f.params[j]] = j;
      f.offsets.push_back(f.numel);
      f.numel += s.params[f.params[j]].tensor.numel();
    }
    const int64_t n = s.group(f).size();
    f.padded = (f.numel + n - 1) / n * n;
    f.shard = f.padded / n;
    // Every rank starts from rank 0's weights (of the shard group, then of the replicas).
    f.full = at::zeros({f.padded}, on_device(at::kFloat));
    for (size_t j = 0; j < f.params.size(); ++j) {
      const at::Tensor& t = s.params[f.params[j]].tensor;
      f.full.narrow(0, f.offsets[j], t.numel()).copy_(t.detach().reshape({-1}));
    }
    s.group(f).broadcast(f.full, 0);
    replicate.broadcast(f.full, 0);
    for (size_t j = 0; j < f.params.size(); ++j) {
      at::Tensor& t = s.params[f.params[j]].tensor;
      t.set_data(f.full.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
    }
    at::Tensor owned = f.full.narrow(0, s.owned_offset(f), f.shard);
    // Stages 1 and 2 update the owned slice of the parameters in place; stage 3 keeps it apart.
    owned = o.stage == 3 ? owned.clone() : owned.detach();
    if (o.offload) owned = at::empty({f.shard}, on_host()).copy_(owned);  // the host master slice
    owned.requires_grad_(true);
    s.shards.push_back(Param{fmt::format("zero/unit{}/{}{}{}{}{}", f.unit, f.decay ? "decay" : "no_decay",
                                         f.tp_split ? "/tp_split" : "", f.partial ? "/sequence_partial" : "",
                                         f.replica ? "/replica" : "", f.expert ? "/experts" : ""),
                             owned, {f.shard}, f.tp_split ? 0 : -1, f.partial, f.decay, f.replica});
    // Stage 1's gradients are views of grad_full, so in the parameters' dtype: with bf16 parameters they
    // accumulate and are reduced in bf16 (DeepSpeed's 16-bit gradients); stages 2 and 3 reduce in fp32.
    if (o.stage == 1) f.grad_full = at::zeros({f.padded}, on_device(o.bf16_params ? at::kBFloat16 : at::kFloat));
    if (o.bf16_params) {
      // Before the gradient accumulators exist: they take the parameters' dtype.
      f.full = f.full.to(at::kBFloat16);
      for (size_t j = 0; j < f.params.size(); ++j) {
        at::Tensor& t = s.params[f.params[j]].tensor;
        t.set_data(f.full.narrow(0, f.offsets[j], t.numel()).view(t.sizes()));
      }
    }
  }
  if (o.stage >= 2) {
    for (size_t k = 0; k < s.params.size(); ++k) {
      State* st = &s;
      s.accumulators.push_back(on_grad_ready(s.params[k].tensor, "zero: parameter " + s.params[k].name,
                                             [st, k] { st->mark_ready(k); }));
    }
  }
  if (o.stage == 3) {
    for (const auto& [unit, members] : s.units) s.free_unit(unit);
    s.gathered_bytes = s.peak_gathered = 0;  // construction held everything whole: not counted
    model.set_unit_hooks(this);
  }
  s.reset_backward();
  zero_grad();
}

ShardedDataParallel::~ShardedDataParallel() {
  if (s_->o.stage == 3) s_->model.set_unit_hooks(nullptr);
}

int ShardedDataParallel::stage() const { return s_->o.stage; }
Comm& ShardedDataParallel::shard_group() { return s_->shard; }
std::vector<Param>& ShardedDataParallel::shard_params() { return s_->shards; }

void ShardedDataParallel::zero_grad() {
  State& s = *s_;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    Flat& f = s.flats[i];
    at::Tensor& g = s.reduced_grad(i);
    if (s.o.offload && !s.shards[i].tensor.grad().defined()) {
      s.shards[i].tensor.mutable_grad() = at::empty({f.shard}, on_host());  // written whole by finish()
    }
    if (s.o.stage == 1) {
      // Gradients accumulate in place in the flat buffer (AccumulateGrad adds into a defined .grad).
      f.grad_full.zero_();
      for (size_t j = 0; j < f.params.size(); ++j) {
        at::Tensor& t = s.params[f.params[j]].tensor;
        t.mutable_grad() = f.grad_full.narrow(0, f.offsets[j], t.numel()).view(t.sizes());
      }
      g = f.grad_full.narrow(0, s.owned_offset(f), f.shard);
    } else {
      for (size_t k : f.params) s.params[k].tensor.mutable_grad() = at::Tensor();
      if (!g.defined()) g = at::zeros({f.shard}, on_device(at::kFloat));
      g.zero_();
    }
  }
  s.saw_backward = false;
}

void ShardedDataParallel::after_backward() {
  State& s = *s_;
  if (s.o.stage == 1) return;  // gradients accumulate whole until finish()
  // An unused parameter's slice of the flat gradient stays zero.
  std::vector<std::string> unused =
      sweep_unused(s.params, s.ready, s.o.find_unused, [&](size_t k) { s.flats[s.flat_of[k]].pending -= 1; });
  if (!unused.empty()) {
    if (s.last_launched >= 0) s.complete(s.last_launched);
    s.reset_backward();
    throw_unused("zero", std::move(unused));
  }
  s.launch_ready();
  if (s.last_launched >= 0) s.complete(s.last_launched);
  if (s.o.stage == 3) {
    for (const auto& [unit, members] : s.units) s.free_unit(unit);
  }
  s.reset_backward();
}

void ShardedDataParallel::finish() {
  State& s = *s_;
  if (s.o.stage == 1) {
    for (auto& f : s.flats) {
      f.grad_out = at::empty({f.shard}, on_device(f.grad_full.scalar_type()));
      f.reduce = s.group(f).reduce_scatter_async(f.grad_out, f.grad_full);
    }
  } else if (!s.saw_backward) {
    throw std::logic_error("zero: finish() without a backward since zero_grad()");
  }
  const bool cuda = computes_on_cuda();
  for (size_t i = 0; i < s.flats.size(); ++i) {
    Flat& f = s.flats[i];
    if (s.o.stage == 1) {
      f.reduce.wait();
      if (s.replicate.size() > 1) s.replicate.all_reduce(f.grad_out);
      f.grad_full.narrow(0, s.owned_offset(f), f.shard).copy_(f.grad_out);
      f.grad_out = at::Tensor();
    }
    // Sequence parallelism leaves some replicated gradients partial per tp rank:
    // every tp rank holds the same slices of them, so the sum is over the slices.
    if (f.partial && s.tp.size() > 1) s.tp.all_reduce(s.reduced_grad(i));
    // Offload: the slice is final; its copy down runs while the next flat's reduction is waited for.
    if (s.o.offload) s.shards[i].tensor.mutable_grad().copy_(s.reduced_grad(i), /*non_blocking=*/cuda);
  }
  if (s.o.offload && cuda) synchronize_compute_device();  // AdamW reads the host copies next
}

void ShardedDataParallel::after_step() {
  State& s = *s_;
  if (s.o.stage == 3) return;  // the next forward gathers the updated shards
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> owned;
  std::vector<CommWork> works;
  for (size_t i = 0; i < s.flats.size(); ++i) {
    const at::Tensor& slice = s.shards[i].tensor;
    // The input must not alias the output; offloaded slices go up to the device first (from pinned
    // memory: queued on the device's stream ahead of the gather).
    owned.push_back(s.o.offload ? at::empty({s.flats[i].shard}, on_device(s.flats[i].full.scalar_type()))
                                      .copy_(slice.detach(), /*non_blocking=*/computes_on_cuda())
                                : slice.detach().clone());
    works.push_back(s.group(s.flats[i]).all_gather_async(s.flats[i].full, owned.back()));
  }
  for (auto& w : works) w.wait();
}

void ShardedDataParallel::gather_params() {
  if (s_->o.stage != 3) return;
  for (const auto& [unit, members] : s_->units) s_->ensure_unit(unit);
}

void ShardedDataParallel::release_params() {
  if (s_->o.stage != 3) return;
  for (const auto& [unit, members] : s_->units) s_->free_unit(unit);
}

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

size_t ShardedDataParallel::flats() const { return s_->flats.size(); }

int64_t ShardedDataParallel::padded_numel() const {
  int64_t n = 0;
  for (const auto& f : s_->flats) n += f.padded;
  return n;
}

int64_t ShardedDataParallel::padded_numel(int64_t unit) const {
  int64_t n = 0;
  for (const auto& f : s_->flats) n += f.unit == s_->home(unit) ? f.padded : 0;
  return n;
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
