#include "meshtrain/plan/posttrain.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "meshtrain/plan/count.h"

namespace meshtrain::plan {
namespace {

// The same reserve line as the pre-training ledger (memory.cpp): never hidden.
void add_reserve(StageLedger& L) { L.lines.push_back(reserve_line(L.device_total())); }

}  // namespace

int64_t lora_params(const ModelSpec& m, const LoraOptions& o) {
  if (o.rank < 1) throw std::invalid_argument(fmt::format("LoRA rank {} must be positive", o.rank));
  const int64_t h = m.hidden, q = m.heads * m.head_dim(), kv = m.kv_heads * m.head_dim(), f = m.ffn;
  auto adapter = [&](int64_t in, int64_t out) { return o.rank * (in + out); };
  int64_t per_layer = 0;
  if (o.targets == "qv") {
    per_layer = adapter(h, q) + adapter(h, kv);
  } else if (o.targets == "all") {
    per_layer = adapter(h, q) + 2 * adapter(h, kv) + adapter(q, h);
    const int64_t ins = m.activation == Activation::SwiGLU ? 2 : 1;
    per_layer += ins * adapter(h, f) + adapter(f, h);
  } else {
    throw std::invalid_argument(fmt::format("LoRA targets '{}': use qv or all", o.targets));
  }
  return m.layers * per_layer;
}

int64_t lora_params_matching(const ModelSpec& m, int64_t rank, const std::vector<std::string>& targets) {
  if (rank < 1) throw std::invalid_argument(fmt::format("LoRA rank {} must be positive", rank));
  const bool all = targets.empty() || targets == std::vector<std::string>{"all"};
  const int64_t h = m.hidden, q = m.heads * m.head_dim(), kv = m.kv_heads * m.head_dim();
  int64_t total = 0;
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    const std::string ffn = p + (m.moe_layer(i) ? "moe.shared." : "mlp.");
    const int64_t f = m.moe_layer(i) ? m.shared_experts * m.expert_width() : m.ffn;
    std::vector<std::tuple<std::string, int64_t, int64_t>> linears{
        {p + "attn.q", h, q}, {p + "attn.k", h, kv}, {p + "attn.v", h, kv}, {p + "attn.o", q, h}};
    if (f > 0 && m.activation == Activation::SwiGLU) {
      linears.insert(linears.end(), {{ffn + "gate", h, f}, {ffn + "up", h, f}, {ffn + "down", f, h}});
    } else if (f > 0) {
      linears.insert(linears.end(), {{ffn + "fc1", h, f}, {ffn + "fc2", f, h}});
    }
    for (const auto& [name, in, out] : linears) {
      const bool hit = all || std::any_of(targets.begin(), targets.end(),
                                          [&](const std::string& t) { return name.find(t) != std::string::npos; });
      if (hit) total += rank * (in + out);
    }
  }
  return total;
}

double qlora_bits_per_param(bool double_quant) { return 4.0 + (double_quant ? 8.0 / 64 + 32.0 / (64 * 256) : 32.0 / 64); }

int64_t block_linear_weights(const ModelSpec& m) {
  const int64_t h = m.hidden, q = m.heads * m.head_dim(), kv = m.kv_heads * m.head_dim(), f = m.ffn;
  const int64_t ins = m.activation == Activation::SwiGLU ? 2 : 1;
  return m.layers * (h * q + 2 * h * kv + q * h + ins * h * f + f * h);
}

LoraStates lora_state_bytes(const ModelSpec& m, const Strategy& s, const LoraOptions& o, int64_t vocab_multiple) {
  validate(s, m);
  const double split = static_cast<double>(s.tp) * s.pp;
  const double base = static_cast<double>(count_params(m, vocab_multiple).total) / split;
  const double adapters = static_cast<double>(lora_params(m, o)) / split;
  const double weight_bytes = s.precision == Precision::Fp32 ? 4 : 2;
  LoraStates out;
  if (o.qlora) {
    const double linear = static_cast<double>(block_linear_weights(m)) / split;
    out.base = linear * qlora_bits_per_param(o.double_quant) / 8 + (base - linear) * weight_bytes;
  } else {
    out.base = base * weight_bytes;
  }
  out.adapters = model_state_bytes(adapters, s.precision, s.zero, s.shard_group());
  return out;
}

StageLedger lora_ledger(const ModelSpec& m, const Strategy& s, const LoraOptions& o) {
  const LoraStates st = lora_state_bytes(m, s, o);
  const double split = static_cast<double>(s.tp) * s.pp;
  const double base = static_cast<double>(count_params(m).total) / split;
  const double adapters = static_cast<double>(lora_params(m, o)) / split;
  const double weight_bytes = s.precision == Precision::Fp32 ? 4 : 2;
  StageLedger L;
  L.layers = m.layers / s.pp;
  L.params = base + adapters;
  if (o.qlora) {
    const double linear = static_cast<double>(block_linear_weights(m)) / split;
    L.lines.push_back({"frozen base (NF4 linears)", st.base,
                       fmt::format("{:.4g} linear weights x {:.3f} bits (4 + constants{}) + {:.4g} others x {:.0f} B",
                                   linear, qlora_bits_per_param(o.double_quant),
                                   o.double_quant ? ", double-quantised" : "", base - linear, weight_bytes)});
  } else {
    L.lines.push_back({"frozen base", st.base, fmt::format("{:.4g} params x {:.0f} B", base, weight_bytes)});
  }
  L.lines.push_back({"adapters + grads + optimizer", st.adapters.total(),
                     fmt::format("{:.4g} trainable (rank {}, {}) x {:.0f} B", adapters, o.rank, o.targets,
                                 st.adapters.total() / std::max(adapters, 1.0))});
  const double per_layer = layer_activation_bytes(m, s);
  L.lines.push_back({"activations", per_layer * L.layers * std::min<int64_t>(s.pp, s.microbatches()),
                     "the full backward still runs through the frozen layers"});
  add_reserve(L);
  return L;
}

namespace {

// RL's models on one rank: the trained actor (and PPO's critic) in the
// precision of `s` (16 B per parameter in fp32 and in mixed precision), frozen
// models as weights only (fp32: 4 B, else 2 B), the rollout's KV cache and the
// actor's training activations. `trained` and `frozen` name the models of each kind.
StageLedger rl_ledger(const ModelSpec& m, const Strategy& s, const RlhfOptions& o,
                      const std::vector<std::pair<std::string, std::string>>& trained,
                      const std::vector<std::pair<std::string, std::string>>& frozen) {
  validate(s, m);
  const double split = static_cast<double>(s.tp) * s.pp;
  const double psi = static_cast<double>(count_params(m).total) / split;
  StageLedger L;
  L.layers = m.layers / s.pp;
  L.params = static_cast<double>(trained.size() + frozen.size()) * psi;
  const ModelStates states = model_state_bytes(psi, s.precision, s.zero, s.shard_group());
  for (const auto& [name, why] : trained) {
    L.lines.push_back({name, states.total(),
                       why.empty() ? fmt::format("{:.4g} params x {:.0f} B, ZeRO-{}", psi, states.total() / psi, s.zero)
                                   : why});
  }
  const double frozen_bytes = s.precision == Precision::Fp32 ? 4 : 2;  // weights (and KV cache) in the run's precision
  for (const auto& [name, why] : frozen) L.lines.push_back({name, psi * frozen_bytes, why});
  const double per_token = 2.0 * m.layers / s.pp * m.kv_heads * m.head_dim() * frozen_bytes / s.tp;
  const double tokens = static_cast<double>(o.rollout_batch) * (o.prompt_tokens + o.generated_tokens);
  L.lines.push_back({"rollout KV cache", per_token * tokens,
                     fmt::format("2 L g d_head x {:.0f} B per token x {} sequences x {} tokens", frozen_bytes,
                                 o.rollout_batch, o.prompt_tokens + o.generated_tokens)});
  L.lines.push_back({"training activations", layer_activation_bytes(m, s) * L.layers,
                     trained.size() > 1 ? "actor's (the critic's alike, not at once)" : "the actor's"});
  add_reserve(L);
  return L;
}

}  // namespace

StageLedger rlhf_ledger(const ModelSpec& m, const Strategy& s, const RlhfOptions& o) {
  return rl_ledger(m, s, o, {{"actor (trained)", ""}, {"critic (trained)", "same shape as the actor"}},
                   {{"reference (frozen)", "weights only"}, {"reward (frozen)", "weights only"}});
}

StageLedger grpo_ledger(const ModelSpec& m, const Strategy& s, const RlhfOptions& o, bool reference) {
  std::vector<std::pair<std::string, std::string>> frozen;
  if (reference) frozen.push_back({"reference (frozen)", "weights only (KL term on)"});
  return rl_ledger(m, s, o, {{"actor (trained)", ""}}, frozen);
}

}  // namespace meshtrain::plan
