#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {
namespace {

ModelSpec gpt(const std::string& name, int64_t vocab, int64_t seq, int64_t layers, int64_t hidden, int64_t heads) {
  ModelSpec m;
  m.name = name;
  m.vocab = vocab;
  m.seq = seq;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn = 4 * hidden;
  return m;  // LayerNorm, learned positions, GELU, tied, biases, dropout 0.1
}

// Llama-style: RMSNorm, RoPE, SwiGLU, no biases, no dropout, usually untied.
ModelSpec llama(const std::string& name, int64_t vocab, int64_t seq, int64_t layers, int64_t hidden, int64_t heads,
                int64_t kv_heads, int64_t ffn, bool tied = false) {
  ModelSpec m = gpt(name, vocab, seq, layers, hidden, heads);
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.norm = Norm::RMSNorm;
  m.position = Position::RoPE;
  m.activation = Activation::SwiGLU;
  m.tied = tied;
  m.bias = false;
  m.dropout = 0.0;
  return m;
}

std::map<std::string, ModelSpec> make_presets() {
  std::map<std::string, ModelSpec> p;
  auto add = [&](ModelSpec m) { p[m.name] = m; };
  // GPT-2 (Radford et al. 2019): vocab 50257, 1024 positions.
  add(gpt("gpt2-124m", 50257, 1024, 12, 768, 12));
  add(gpt("gpt2-350m", 50257, 1024, 24, 1024, 16));
  add(gpt("gpt2-774m", 50257, 1024, 36, 1280, 20));
  add(gpt("gpt2-1.5b", 50257, 1024, 48, 1600, 25));
  // GPT-3 175B (Brown et al. 2020, Table 2.1).
  add(gpt("gpt3-175b", 50257, 2048, 96, 12288, 96));
  // Megatron-LM paper series (Narayanan et al., arXiv 2104.04473, Table 1): vocab 51200, seq 2048.
  add(gpt("megatron-1.7b", 51200, 2048, 24, 2304, 24));
  add(gpt("megatron-3.6b", 51200, 2048, 30, 3072, 32));
  add(gpt("megatron-7.5b", 51200, 2048, 36, 4096, 32));
  add(gpt("megatron-18b", 51200, 2048, 40, 6144, 48));
  add(gpt("megatron-39b", 51200, 2048, 48, 8192, 64));
  add(gpt("megatron-76b", 51200, 2048, 60, 10240, 80));
  add(gpt("megatron-145b", 51200, 2048, 80, 12288, 96));
  add(gpt("megatron-310b", 51200, 2048, 96, 16384, 128));
  add(gpt("megatron-530b", 51200, 2048, 105, 20480, 128));
  add(gpt("megatron-1t", 51200, 2048, 128, 25600, 160));
  // Korthikanti et al. (arXiv 2205.05198, Table 3): vocab 51200, seq 2048.
  add(gpt("korthikanti-22b", 51200, 2048, 48, 6144, 64));
  add(gpt("korthikanti-175b", 51200, 2048, 96, 12288, 96));
  add(gpt("korthikanti-530b", 51200, 2048, 105, 20480, 128));
  add(gpt("korthikanti-1t", 51200, 2048, 128, 25600, 160));
  // Llama 2 (Touvron et al. 2023) and Llama 3 (Dubey et al. 2024).
  add(llama("llama2-7b", 32000, 4096, 32, 4096, 32, 32, 11008));
  add(llama("llama2-13b", 32000, 4096, 40, 5120, 40, 40, 13824));
  add(llama("llama2-70b", 32000, 4096, 80, 8192, 64, 8, 28672));
  for (auto m : {llama("llama3-8b", 128256, 8192, 32, 4096, 32, 8, 14336),
                 llama("llama3-70b", 128256, 8192, 80, 8192, 64, 8, 28672),
                 llama("llama3-405b", 128256, 8192, 126, 16384, 128, 8, 53248),
                 llama("llama-1b", 128256, 8192, 16, 2048, 32, 8, 8192, true)}) {  // Llama 3.2 1B shape
    m.rope_theta = 500000.0;
    add(m);
  }
  // Small shapes for tests and CPU runs.
  add(llama("llama-tiny", 512, 256, 4, 128, 4, 2, 344, false));
  add(gpt("gpt-tiny", 512, 256, 4, 128, 4));
  ModelSpec moe = llama("moe-tiny", 512, 256, 4, 128, 4, 2, 128, false);
  moe.experts = 8;
  moe.top_k = 2;
  add(moe);
  return p;
}

const std::map<std::string, ModelSpec>& presets() {
  static const auto p = make_presets();
  return p;
}

}  // namespace

const ModelSpec& preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    throw std::invalid_argument(fmt::format("unknown model '{}'; presets: {}", name, fmt::join(preset_names(), ", ")));
  }
  return it->second;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

int64_t padded_vocab(int64_t vocab, int64_t multiple) {
  if (multiple <= 0) throw std::invalid_argument(fmt::format("vocab padding multiple {} must be positive", multiple));
  return (vocab + multiple - 1) / multiple * multiple;
}

void validate(const ModelSpec& m) {
  // Positive, and small enough that a product of two stays inside int64; layers
  // also bounds what is built per layer (parameter names, LoRA's target list).
  auto positive = [&](const char* field, int64_t v, int64_t most = (int64_t{1} << 31) - 1) {
    if (v <= 0) throw std::invalid_argument(fmt::format("model '{}': {} = {} must be positive", m.name, field, v));
    if (v > most) {
      throw std::invalid_argument(fmt::format("model '{}': {} = {} is more than {}, the most meshtrain builds or plans",
                                              m.name, field, v, most));
    }
  };
  positive("vocab", m.vocab);
  positive("seq", m.seq);
  positive("layers", m.layers, 100000);
  positive("hidden", m.hidden);
  positive("heads", m.heads);
  positive("kv_heads", m.kv_heads);
  positive("ffn", m.ffn);
  if (m.hidden % m.heads != 0) {
    throw std::invalid_argument(fmt::format("model '{}': hidden {} is not divisible by heads {}", m.name, m.hidden,
                                            m.heads));
  }
  if (m.heads % m.kv_heads != 0) {
    throw std::invalid_argument(fmt::format("model '{}': heads {} is not divisible by kv_heads {}", m.name, m.heads,
                                            m.kv_heads));
  }
  if (m.experts > (int64_t{1} << 20)) {
    throw std::invalid_argument(fmt::format("model '{}': experts = {} is more than 2^20, the most meshtrain builds or plans",
                                            m.name, m.experts));
  }
  if (m.experts < 0 || m.top_k < 0 || (m.experts > 0 && (m.top_k < 1 || m.top_k > m.experts))) {
    throw std::invalid_argument(fmt::format("model '{}': top_k {} must be in 1..experts ({}): lower model.top_k or "
                                            "raise model.experts",
                                            m.name, m.top_k, m.experts));
  }
  if (m.moe() && m.router != "softmax" && m.router != "sigmoid") {
    throw std::invalid_argument(fmt::format("model '{}': router \"{}\" unknown: use \"softmax\" or \"sigmoid\"", m.name,
                                            m.router));
  }
  if (m.moe() && (m.moe_every < 1 || m.shared_experts < 0 || m.expert_ffn < 0 || m.capacity_factor < 0 ||
                  m.aux_loss_coef < 0 || m.z_loss_coef < 0)) {
    throw std::invalid_argument(fmt::format("model '{}': moe_every {} must be >= 1, shared_experts {} and expert_ffn {} "
                                            ">= 0, capacity_factor {} > 0 (or 0: dropless), aux_loss_coef {} and "
                                            "z_loss_coef {} >= 0",
                                            m.name, m.moe_every, m.shared_experts, m.expert_ffn, m.capacity_factor,
                                            m.aux_loss_coef, m.z_loss_coef));
  }
  if (m.moe() && m.router == "sigmoid" && m.top_k < 2) {
    throw std::invalid_argument(fmt::format("model '{}': router \"sigmoid\" normalises its gates over the top k: it "
                                            "needs top_k >= 2 (it is {})",
                                            m.name, m.top_k));
  }
  if (m.dropout < 0 || m.dropout >= 1) {
    throw std::invalid_argument(fmt::format("model '{}': dropout {} must be in [0, 1)", m.name, m.dropout));
  }
}

AttentionImpl parse_attention(const std::string& s) {
  if (s == "naive") return AttentionImpl::Naive;
  if (s == "tiled") return AttentionImpl::Tiled;
  if (s == "sdpa") return AttentionImpl::Sdpa;
  if (s == "auto") return AttentionImpl::Auto;
  throw std::invalid_argument(
      fmt::format("model.attention = \"{}\": use \"naive\", \"tiled\", \"sdpa\" or \"auto\"", s));
}

const char* attention_name(AttentionImpl a) {
  return a == AttentionImpl::Tiled ? "tiled" : a == AttentionImpl::Auto ? "auto" : a == AttentionImpl::Sdpa ? "sdpa" : "naive";
}

bool attention_tiled(AttentionImpl a, int64_t keys, bool documents) {
  if (a == AttentionImpl::Auto) return documents || keys >= kAutoTiledKeys;
  return a == AttentionImpl::Tiled;
}

bool attention_sdpa(AttentionImpl a, double dropout, bool documents, int cp, bool cuda) {
  if (dropout > 0 || documents) return false;
  return a == AttentionImpl::Sdpa || (a == AttentionImpl::Auto && (cuda || cp == 1));
}

}  // namespace meshtrain::plan
