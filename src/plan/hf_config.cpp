#include "meshtrain/plan/hf_config.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain::plan {
namespace {

// Typed reads of config.json's fields, each wrong one an error naming the key:
// a missing key (where it has no default), another JSON type, a whole number
// outside lo..2^31-1 (so products of two shapes cannot overflow).
constexpr int64_t kLargest = (int64_t{1} << 31) - 1;

int64_t whole(const nlohmann::json& j, const char* key, std::optional<int64_t> fallback = {}, int64_t lo = 1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    throw std::invalid_argument(fmt::format("Hugging Face config.json lacks \"{}\"", key));
  }
  if (!j[key].is_number_integer()) {
    throw std::invalid_argument(fmt::format("config.json: \"{}\" is {}, not a whole number", key, j[key].dump()));
  }
  // An unsigned number past int64's range reads as one past the largest.
  const int64_t v = j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t{kLargest} ? kLargest + 1
                                                                                            : j[key].get<int64_t>();
  if (v < lo || v > kLargest) {
    throw std::invalid_argument(fmt::format("config.json: \"{}\" = {} is outside {}..{}", key, j[key].dump(), lo, kLargest));
  }
  return v;
}

double number(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) {
    throw std::invalid_argument(fmt::format("config.json: \"{}\" is {}, not a number", key, j[key].dump()));
  }
  return j[key].get<double>();
}

bool flag(const nlohmann::json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) {
    throw std::invalid_argument(fmt::format("config.json: \"{}\" is {}, not true or false", key, j[key].dump()));
  }
  return j[key].get<bool>();
}

// Llama-family decoder: RMSNorm, RoPE, SwiGLU, no biases.
ModelSpec llama_family(const nlohmann::json& j) {
  ModelSpec m = preset("llama-tiny");
  m.vocab = whole(j, "vocab_size");
  m.hidden = whole(j, "hidden_size");
  m.ffn = whole(j, "intermediate_size");
  m.layers = whole(j, "num_hidden_layers");
  m.heads = whole(j, "num_attention_heads");
  m.kv_heads = whole(j, "num_key_value_heads", m.heads);
  m.seq = whole(j, "max_position_embeddings");
  m.norm_eps = number(j, "rms_norm_eps", 1e-6);
  // transformers 5 writes the rotary base (and its scaling type) under rope_parameters, 4.x at the top level.
  const bool nested = j.contains("rope_parameters") && j["rope_parameters"].is_object();
  m.rope_theta = number(nested ? j["rope_parameters"] : j, "rope_theta", number(j, "rope_theta", 10000.0));
  m.tied = flag(j, "tie_word_embeddings", false);
  if (const int64_t head_dim = whole(j, "head_dim", m.hidden / m.heads); head_dim * m.heads != m.hidden) {
    throw std::invalid_argument(fmt::format(
        "config.json: head_dim {} x {} heads != hidden_size {}; the planner models head_dim = hidden / heads",
        head_dim, m.heads, m.hidden));
  }
  return m;
}

}  // namespace

ModelSpec model_from_hf_config(const nlohmann::json& j, const std::string& name) {
  if (!j.is_object()) throw std::invalid_argument("config.json is not a JSON object");
  if (j.contains("model_type") && !j["model_type"].is_string()) {
    throw std::invalid_argument(fmt::format("config.json: \"model_type\" is {}, not a string", j["model_type"].dump()));
  }
  const std::string type = j.value("model_type", "");
  ModelSpec m;
  if (type == "gpt2") {
    m = preset("gpt-tiny");
    m.vocab = whole(j, "vocab_size");
    m.seq = whole(j, "n_positions");
    m.hidden = whole(j, "n_embd");
    m.layers = whole(j, "n_layer");
    m.heads = m.kv_heads = whole(j, "n_head");
    m.ffn = whole(j, "n_inner", 4 * m.hidden);
    m.norm_eps = number(j, "layer_norm_epsilon", 1e-5);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3") {
    m = llama_family(j);
  } else if (type == "mixtral") {
    m = llama_family(j);
    m.experts = whole(j, "num_local_experts");
    m.top_k = whole(j, "num_experts_per_tok");
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    m = llama_family(j);
    m.experts = whole(j, "num_experts");
    m.top_k = whole(j, "num_experts_per_tok");
    m.expert_ffn = whole(j, "moe_intermediate_size");
    m.moe_every = whole(j, "decoder_sparse_step", 1);
    const int64_t shared = whole(j, "shared_expert_intermediate_size", 0, 0);
    if (shared % m.expert_ffn != 0) {
      throw std::invalid_argument(fmt::format("config.json: shared_expert_intermediate_size {} is not a multiple of "
                                              "moe_intermediate_size {}; the planner counts shared experts of that width",
                                              shared, m.expert_ffn));
    }
    m.shared_experts = shared / m.expert_ffn;
  } else if (type.rfind("deepseek", 0) == 0) {
    throw std::invalid_argument(fmt::format("config.json: model_type \"{}\" uses multi-head latent attention "
                                            "(kv_lora_rank), which the planner does not model; give its shape with "
                                            "flags (--layers --hidden --heads --ffn --experts ...) as an approximation",
                                            type));
  } else {
    throw std::invalid_argument(fmt::format("config.json: model_type \"{}\" is not read; the planner reads gpt2, "
                                            "llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe (or give the "
                                            "shape with flags)",
                                            type));
  }
  m.name = name;
  m.dropout = 0;
  validate(m);
  return m;
}

ModelSpec model_from_hf_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(file);
  if (!in) throw std::invalid_argument(fmt::format("cannot read {}", file.string()));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: not JSON ({})", file.string(), e.what()));
  }
  try {
    return model_from_hf_config(j, file.parent_path().filename().string().empty()
                                       ? file.stem().string()
                                       : file.parent_path().filename().string());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", file.string(), e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: a field has the wrong type ({})", file.string(), e.what()));
  }
}

bool ShapeFlags::any() const {
  return layers || hidden || heads || kv_heads || ffn || vocab || experts || top_k || expert_ffn;
}

ModelSpec apply_shape_flags(ModelSpec m, const ShapeFlags& f) {
  if (!f.any()) return m;
  const bool kv_follows = m.kv_heads == m.heads && !f.kv_heads;
  if (f.layers) m.layers = *f.layers;
  if (f.hidden) m.hidden = *f.hidden;
  if (f.heads) m.heads = *f.heads;
  m.kv_heads = f.kv_heads ? *f.kv_heads : kv_follows ? m.heads : m.kv_heads;
  if (f.ffn) m.ffn = *f.ffn;
  if (f.vocab) m.vocab = *f.vocab;
  if (f.experts) m.experts = *f.experts;
  if (f.top_k) m.top_k = *f.top_k;
  if (f.expert_ffn) m.expert_ffn = *f.expert_ffn;
  if (m.experts > 0 && m.top_k == 0) {
    throw std::invalid_argument(fmt::format("--experts {} needs --top-k (experts per token)", m.experts));
  }
  m.name += " (shape from flags)";
  validate(m);
  return m;
}

ModelSpec model_from_flags(const std::string& family, const ShapeFlags& f, int64_t seq) {
  if (family != "gpt" && family != "llama") {
    throw std::invalid_argument(fmt::format("--family '{}': use gpt or llama", family));
  }
  std::string missing;
  for (auto [flag, v] : {std::pair{"--layers", f.layers}, {"--hidden", f.hidden}, {"--heads", f.heads},
                         {"--ffn", f.ffn}, {"--vocab", f.vocab}}) {
    if (!v) missing += std::string(missing.empty() ? "" : " ") + flag;
  }
  if (seq <= 0) missing += std::string(missing.empty() ? "" : " ") + "--seq";
  if (!missing.empty()) {
    throw std::invalid_argument(fmt::format("a model from flags needs {} (or --model PRESET|config.json|train.toml "
                                            "for the flags to modify)",
                                            missing));
  }
  ModelSpec m = preset(family == "gpt" ? "gpt-tiny" : "llama-tiny");
  m.name = family;
  m.seq = seq;
  m.kv_heads = m.heads;
  return apply_shape_flags(m, f);
}

}  // namespace meshtrain::plan
