#include "meshtrain/parallel/data/zero.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "meshtrain/comm/comm.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/runtime/runtime.h"
#include "parallel/data/grad_ready.h"
#include "parallel/data/zero_state.h"

namespace meshtrain {
namespace {

using zero_detail::on_device;
using zero_detail::on_host;
using zero_detail::Flat;
using zero_detail::Gathered;

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

void ShardedDataParallel::State::reset_backward() {
  for (auto& f : flats) {
    f.pending = f.params.size();
    f.launched = false;
  }
  ready.assign(params.size(), false);
  next_launch = static_cast<int64_t>(flats.size()) - 1;
  last_launched = -1;
}

// ---- stage 2/3: reducing gradients during backward ----

void ShardedDataParallel::State::mark_ready(size_t k) {
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

void ShardedDataParallel::State::launch_ready() {
  while (next_launch >= 0 && flats[next_launch].pending == 0) launch(next_launch--);
}

void ShardedDataParallel::State::launch(size_t i) {
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

void ShardedDataParallel::State::complete(size_t i) {
  Flat& f = flats[i];
  if (!f.grad_out.defined()) return;
  f.reduce.wait();
  if (replicate.size() > 1) replicate.all_reduce(f.grad_out);
  reduced_grad(i).add_(f.grad_out);
  f.grad_in = at::Tensor();
  f.grad_out = at::Tensor();
}

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

}  // namespace meshtrain
