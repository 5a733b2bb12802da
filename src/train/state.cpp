#include "meshtrain/train/state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "meshtrain/ckpt/flat_boxes.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"

namespace meshtrain {
namespace {

std::vector<int64_t> offsets_of(const Param& p, int tp_rank) {
  std::vector<int64_t> off(p.full_shape.size(), 0);
  if (p.tp_dim >= 0) off[p.tp_dim] = tp_rank * p.tensor.size(p.tp_dim);
  if (p.expert) off[0] = p.expert_offset;
  return off;
}

// A LoRA adapter (peft/lora.h) or bottleneck adapter (peft/adapter.h) the
// checkpoint does not hold: it starts as a new one (B = 0, up = 0), e.g. when
// fine-tuning from a base model's checkpoint.
bool new_adapter(const ckpt::Reader& r, const Param& p) {
  // (A value head, rl/critic.h, on a trunk from a policy checkpoint starts fresh too.)
  return (p.name.find(".lora_") != std::string::npos || p.name.find(".adapter_") != std::string::npos ||
          p.name.rfind("value_head.", 0) == 0) &&
         !r.has("model/" + p.name);
}

}  // namespace

std::vector<ckpt::Piece> training_pieces(Transformer& model, const AdamW* opt, int dp_rank) {
  if (!opt) return training_pieces(model, {}, {}, dp_rank);
  auto& o = const_cast<AdamW&>(*opt);
  return training_pieces(model, o.exp_avg(), o.exp_avg_sq(), dp_rank);
}

namespace {

// Whether this rank writes its copy of `p`: the data-parallel replica chosen
// to write it, and for parameters replicated across tp, tp rank 0.
bool writes(const Param& p, bool dp_lead, int tp_rank) { return dp_lead && (p.tp_dim >= 0 || tp_rank == 0) && !p.replica; }

// Which data-parallel replica writes each parameter and its moments: the
// replicas share the writing, each parameter going to the one with the fewest
// elements so far, in the parameters' order (the same list on every rank, so
// every rank computes the same assignment). PyTorch DCP's dedup_save_plans and
// Megatron-Core's fully parallel save spread replicated tensors the same way:
// a save's time and an async snapshot's memory split over the replicas instead
// of landing on rank 0. Experts count among their own replicas (expert_dp).
std::vector<int> replica_writers(const std::vector<Param>& params, int dp_size, bool experts_apart,
                                 int expert_dp_size) {
  std::vector<int64_t> dense(std::max(1, dp_size), 0), expert(std::max(1, expert_dp_size), 0);
  std::vector<int> out;
  out.reserve(params.size());
  for (const Param& p : params) {
    std::vector<int64_t>& load = p.expert && experts_apart ? expert : dense;
    const auto least = std::min_element(load.begin(), load.end());
    *least += p.tensor.numel();
    out.push_back(static_cast<int>(least - load.begin()));
  }
  return out;
}

// Range k's boxes in the parameter's global coordinates, with the views of
// `slice` that hold them.
template <class F>
void for_each_box(const Param& p, int tp_rank, const OwnedRange& k, F f) {
  const auto base = offsets_of(p, tp_rank);
  for (const auto& b : ckpt::flat_range_boxes(p.tensor.sizes().vec(), k.begin, k.end)) {
    std::vector<int64_t> global = b.offsets;
    for (size_t d = 0; d < global.size(); ++d) global[d] += base[d];
    int64_t n = 1;
    for (int64_t x : b.shape) n *= x;
    f(global, b.shape, k.at + b.start - k.begin, n);
  }
}

}  // namespace

std::vector<ckpt::Piece> training_pieces(Transformer& model, const std::vector<at::Tensor>& exp_avg,
                                         const std::vector<at::Tensor>& exp_avg_sq, int dp_rank,
                                         int expert_dp_rank, int dp_size, int expert_dp_size) {
  const int tp_rank = model.params().tp_rank();
  std::vector<ckpt::Piece> out;
  auto& params = model.params().params();
  const std::vector<int> writer = replica_writers(params, dp_size, expert_dp_rank >= 0, expert_dp_size);
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const bool owner = writes(p, (p.expert && expert_dp_rank >= 0 ? expert_dp_rank : dp_rank) == writer[i], tp_rank);
    const auto off = offsets_of(p, tp_rank);
    out.push_back({"model/" + p.name, p.tensor.detach(), p.full_shape, off, owner});
    if (!exp_avg.empty() && exp_avg.at(i).defined()) {
      out.push_back({"optim/exp_avg/" + p.name, exp_avg.at(i), p.full_shape, off, owner});
      out.push_back({"optim/exp_avg_sq/" + p.name, exp_avg_sq.at(i), p.full_shape, off, owner});
    }
  }
  return out;
}

std::vector<ckpt::Piece> zero_pieces(Transformer& model, const ZeroSlices& z, int dp_rank) {
  const int tp_rank = model.params().tp_rank();
  std::vector<ckpt::Piece> out;
  auto& params = model.params().params();
  for (const Param& p : params) {  // frozen parameters are whole on every rank (not in the flats)
    if (p.frozen) out.push_back({"model/" + p.name, p.tensor.detach(), p.full_shape, offsets_of(p, tp_rank),
                                 writes(p, dp_rank == 0, tp_rank)});
  }
  for (const OwnedRange& k : z.ranges) {
    const Param& p = params.at(k.param);
    const bool owner = writes(p, z.replica_lead, tp_rank);
    for_each_box(p, tp_rank, k, [&](const std::vector<int64_t>& global, const std::vector<int64_t>& shape, int64_t at,
                                    int64_t n) {
      auto view = [&](const std::vector<at::Tensor>& slices) { return slices.at(k.flat).narrow(0, at, n).view(shape); };
      out.push_back({"model/" + p.name, view(z.weights), p.full_shape, global, owner});
      out.push_back({"optim/exp_avg/" + p.name, view(z.exp_avg), p.full_shape, global, owner});
      out.push_back({"optim/exp_avg_sq/" + p.name, view(z.exp_avg_sq), p.full_shape, global, owner});
    });
  }
  return out;
}

void load_zero_slices(ckpt::Reader& r, Transformer& model, const ZeroSlices& z) {
  check_same_model(r, model.spec());
  at::NoGradGuard no_grad;
  const int tp_rank = model.params().tp_rank();
  auto& params = model.params().params();
  for (const OwnedRange& k : z.ranges) {
    const Param& p = params.at(k.param);
    if (new_adapter(r, p)) continue;  // keeps its fresh values; its moments stay zero
    for_each_box(p, tp_rank, k, [&](const std::vector<int64_t>& global, const std::vector<int64_t>& shape, int64_t at,
                                    int64_t n) {
      auto read = [&](const std::string& name, const std::vector<at::Tensor>& slices) {
        if (!slices.empty()) r.read(name + p.name, slices.at(k.flat).narrow(0, at, n).view(shape), global, p.full_shape);
      };
      read("model/", z.weights);
      read("optim/exp_avg/", z.exp_avg);
      read("optim/exp_avg_sq/", z.exp_avg_sq);
    });
  }
}

void load_model(ckpt::Reader& r, Transformer& model) {
  std::vector<at::Tensor> into;
  for (auto& p : model.params().params()) into.push_back(p.tensor.detach());
  load_model(r, model, into);
}


void check_same_model(const ckpt::Reader& r, const plan::ModelSpec& now) {
  const auto& m = r.manifest();
  if (!m.contains("config") || !m["config"].contains("model")) return;
  const plan::ModelSpec saved = spec_from_json(m["config"]["model"]);
  for (auto [field, a, b] : {std::tuple{"layers", saved.layers, now.layers}, {"hidden", saved.hidden, now.hidden},
                             {"heads", saved.heads, now.heads}, {"kv_heads", saved.kv_heads, now.kv_heads},
                             {"ffn", saved.ffn, now.ffn}, {"vocab", saved.vocab, now.vocab},
                             {"experts", saved.experts, now.experts}, {"moe_every", saved.moe_every, now.moe_every},
                             {"shared_experts", saved.shared_experts, now.shared_experts},
                             {"expert_ffn", saved.expert_width(), now.expert_width()}}) {
    if (a != b) {
      throw std::runtime_error(fmt::format("checkpoint {} has model.{} = {}, the config asks for {}; load it with the "
                                           "model it was trained with",
                                           r.dir(), field, a, b));
    }
  }
  // The architecture too: the same sizes with another norm, position, activation, tying, biases, rotary
  // base, norm epsilon or routing is another model (an imported Llama 3 has rope_theta 500000).
  const nlohmann::json a = spec_to_json(saved), b = spec_to_json(now);
  for (const char* field : {"norm", "position", "activation", "tied", "bias", "rope_theta", "norm_eps", "top_k", "router"}) {
    if ((field == std::string("top_k") || field == std::string("router")) && !saved.moe()) continue;
    if (a[field] != b[field]) {
      const std::string f = field;  // [model] keys; the others come with the preset
      const bool keyed = f == "tied" || f == "rope_theta" || f == "norm_eps" || f == "top_k" || f == "router";
      throw std::runtime_error(fmt::format("checkpoint {} has a model with {} {}, the config's has {} (preset \"{}\" vs "
                                           "\"{}\"); load it with the model it was trained with{}",
                                           r.dir(), field, a[field].dump(), b[field].dump(), saved.name, now.name,
                                           keyed ? fmt::format(": set model.{} = {}", field, a[field].dump()) : ""));
    }
  }
}

void load_model(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& into) {
  check_same_model(r, model.spec());
  at::NoGradGuard no_grad;
  const int tp_rank = model.params().tp_rank();
  auto& params = model.params().params();
  // An adapter checkpoint (trainer.h) leaves the frozen base to its "base" checkpoint, loaded before.
  const bool base_elsewhere = r.manifest().contains("base") && r.manifest()["base"].is_object();
  for (size_t i = 0; i < params.size(); ++i) {
    if (new_adapter(r, params[i])) continue;
    if (base_elsewhere && params[i].frozen && !r.has("model/" + params[i].name)) continue;
    r.read("model/" + params[i].name, into.at(i), offsets_of(params[i], tp_rank), params[i].full_shape);
  }
}

void load_initial_weights(ckpt::Reader& r, Transformer& model) {
  std::vector<at::Tensor> into;
  for (auto& p : model.params().params()) into.push_back(p.tensor.detach());
  load_initial_weights(r, model, into);
}

void load_initial_weights(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& into) {
  check_same_model(r, model.spec());
  at::NoGradGuard no_grad;
  const int tp_rank = model.params().tp_rank();
  const auto& m = r.manifest();
  const bool lora = m.contains("lora") && m["lora"].is_object();
  const double scale = lora ? m["lora"].at("alpha").get<double>() / m["lora"].at("rank").get<double>() : 0;
  auto& params = model.params().params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    // The model's own LoRA adapters start fresh; the checkpoint's are merged below.
    if (p.name.find(".lora_") != std::string::npos || new_adapter(r, p)) continue;
    const auto off = offsets_of(p, tp_rank);
    r.read("model/" + p.name, into.at(i), off, p.full_shape);
    const size_t w = p.name.rfind(".weight");
    const std::string base = w == std::string::npos ? "" : p.name.substr(0, w);
    if (!lora || base.empty() || !r.has("model/" + base + ".lora_a")) continue;
    // W + (alpha / rank) B A, whole, then this rank's box of it.
    at::Tensor delta = at::mm(r.read_full("model/" + base + ".lora_b"), r.read_full("model/" + base + ".lora_a")) * scale;
    for (size_t d = 0; d < off.size(); ++d) delta = delta.narrow(static_cast<int64_t>(d), off[d], into[i].size(d));
    into[i].add_(delta.to(into[i].scalar_type()));
  }
}

void load_moments(ckpt::Reader& r, Transformer& model, std::vector<at::Tensor>& exp_avg,
                  std::vector<at::Tensor>& exp_avg_sq) {
  const int tp_rank = model.params().tp_rank();
  auto& params = model.params().params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!exp_avg.at(i).defined() || new_adapter(r, params[i])) continue;  // frozen: no moments
    const auto off = offsets_of(params[i], tp_rank);
    r.read("optim/exp_avg/" + params[i].name, exp_avg.at(i), off, params[i].full_shape);
    r.read("optim/exp_avg_sq/" + params[i].name, exp_avg_sq.at(i), off, params[i].full_shape);
  }
}

void load_optimizer(ckpt::Reader& r, Transformer& model, AdamW& opt) {
  load_moments(r, model, opt.exp_avg(), opt.exp_avg_sq());
  opt.set_steps(r.manifest().at("optimizer").at("steps").get<int64_t>());
}


}  // namespace meshtrain
