#include "meshtrain/peft/lora.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/keyed_dropout.h"
#include "meshtrain/nn/params.h"

namespace meshtrain {

at::Tensor LoraAdapter::delta(const at::Tensor& x, bool train) const {
  at::Tensor in = x;
  if (train && dropout > 0 && model) {
    if (x.dim() != 3) throw std::logic_error("lora: dropout needs inputs [seq, batch, features]");
    const nn::DropoutKeys& k = model->dropout_keys();
    in = nn::keyed_dropout(x, dropout, k.key(site, 5 /* LoRA's input */),
                           {model->sequence_coords(x.size(0)), k.rows(x.size(1)), nn::span(feature_offset, x.size(2))});
  }
  return at::matmul(at::matmul(in, a.t()), b.t()) * scale;
}

namespace {

bool targeted(const std::string& name, const std::vector<std::string>& targets) {
  if (targets.empty()) return true;
  for (const auto& t : targets) {
    if (t == "all" || name.find(t) != std::string::npos) return true;
  }
  return false;
}

template <typename Fn>
void for_each_adapter(Transformer& m, Fn fn) {
  auto lin = m.linears();
  for (auto& [name, l] : lin.column) {
    if (auto* a = dynamic_cast<LoraAdapter*>(l->delta.get())) fn(*a, l->weight);
  }
  for (auto& [name, l] : lin.row) {
    if (auto* a = dynamic_cast<LoraAdapter*>(l->delta.get())) fn(*a, l->weight);
  }
}

void check_options(const LoraOptions& o) {
  if (o.rank < 1 || !(o.alpha > 0) || o.dropout < 0 || o.dropout >= 1) {
    throw std::invalid_argument(fmt::format("lora: rank {} must be >= 1, alpha {} > 0, dropout {} in [0, 1)", o.rank,
                                            o.alpha, o.dropout));
  }
}

void no_match(const std::vector<std::string>& targets) {
  throw std::invalid_argument(fmt::format("lora: no linear matches the targets {}; names look like layers.0.attn.q, "
                                          "layers.0.mlp.fc1 (or \"all\")",
                                          fmt::join(targets, ", ")));
}

}  // namespace

std::vector<std::string> linear_names(const plan::ModelSpec& m) {
  const bool swiglu = m.activation == plan::Activation::SwiGLU;
  std::vector<std::string> out;
  for (int64_t l = 0; l < m.layers; ++l) {
    for (const char* s : {"attn.q", "attn.k", "attn.v", "attn.o"}) out.push_back(fmt::format("layers.{}.{}", l, s));
    for (const char* s : swiglu ? std::vector<const char*>{"mlp.gate", "mlp.up", "mlp.down"}
                                : std::vector<const char*>{"mlp.fc1", "mlp.fc2"}) {
      out.push_back(fmt::format("layers.{}.{}", l, s));
    }
  }
  return out;
}

void check_lora(const plan::ModelSpec& m, const LoraOptions& o) {
  check_options(o);
  for (const auto& name : linear_names(m)) {
    if (targeted(name, o.targets)) return;
  }
  no_match(o.targets);
}

std::vector<std::string> apply_lora(Transformer& m, const LoraOptions& o) {
  check_options(o);
  ParamStore& store = m.params();
  const size_t base_params = store.params().size();
  std::vector<std::string> names;
  // A [r, in] with PEFT's variance; B [out, r] zero. `a_dim`/`b_dim`: the dims tp splits.
  auto make = [&](const std::string& name, int64_t in, int64_t out, int64_t a_dim, int64_t b_dim,
                  int64_t feature_offset) {
    auto ad = std::make_shared<LoraAdapter>();
    const double std = 1.0 / std::sqrt(3.0 * static_cast<double>(in));
    ad->a = store.create(name + ".lora_a", {o.rank, in}, Init::Normal, std, a_dim, /*partial over tp*/ a_dim < 0);
    ad->b = store.create(name + ".lora_b", {out, o.rank}, Init::Zeros, 0, b_dim, /*partial over tp*/ b_dim < 0);
    ad->scale = o.alpha / static_cast<double>(o.rank);
    ad->dropout = o.dropout;
    ad->model = &m;
    ad->site = stable_hash(name);
    ad->feature_offset = feature_offset;
    names.push_back(name);
    return ad;
  };
  const int tp = store.tp_size();
  auto lin = m.linears();
  for (auto& [name, l] : lin.column) {
    if (!targeted(name, o.targets)) continue;
    l->delta = make(name, l->weight.size(1), l->weight.size(0) * tp, -1, 0, 0);
  }
  for (auto& [name, l] : lin.row) {
    if (!targeted(name, o.targets)) continue;
    l->delta = make(name, l->weight.size(1) * tp, l->weight.size(0), 1, -1, store.tp_rank() * l->weight.size(1));
  }
  if (names.empty()) no_match(o.targets);
  store.freeze_first(base_params);
  return names;
}

void merge_lora(Transformer& m) {
  at::NoGradGuard no_grad;
  for_each_adapter(m, [](LoraAdapter& l, at::Tensor& w) {
    if (l.merged) return;
    if (!w.defined()) {
      throw std::invalid_argument("merge_lora: the base is in NF4 (QLoRA); merge on export (meshtrain ckpt export)");
    }
    w.add_(at::mm(l.b, l.a).to(w.scalar_type()), l.scale);
    l.merged = true;
  });
}

void unmerge_lora(Transformer& m) {
  at::NoGradGuard no_grad;
  for_each_adapter(m, [](LoraAdapter& l, at::Tensor& w) {
    if (!l.merged) return;
    w.sub_(at::mm(l.b, l.a).to(w.scalar_type()), l.scale);
    l.merged = false;
  });
}

void enable_lora(Transformer& m, bool on) {
  for_each_adapter(m, [on](LoraAdapter& l, at::Tensor&) { l.enabled = on; });
}

}  // namespace meshtrain
