#include "meshtrain/plan/hf_config.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain::plan {
namespace {

template <typename T>
T field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) {
    throw std::invalid_argument(fmt::format("Hugging Face config.json lacks \"{}\"", key));
  }
  return j[key].get<T>();
}

// Llama-family decoder: RMSNorm, RoPE, SwiGLU, no biases.
ModelSpec llama_family(const nlohmann::json& j) {
  ModelSpec m = preset("llama-tiny");
  m.vocab = field<int64_t>(j, "vocab_size");
  m.hidden = field<int64_t>(j, "hidden_size");
  m.ffn = field<int64_t>(j, "intermediate_size");
  m.layers = field<int64_t>(j, "num_hidden_layers");
  m.heads = field<int64_t>(j, "num_attention_heads");
  m.kv_heads = j.value("num_key_value_heads", m.heads);
  m.seq = field<int64_t>(j, "max_position_embeddings");
  m.norm_eps = j.value("rms_norm_eps", 1e-6);
  m.rope_theta = j.value("rope_theta", 10000.0);
  m.tied = j.value("tie_word_embeddings", false);
  if (j.contains("head_dim") && !j["head_dim"].is_null() && j["head_dim"].get<int64_t>() * m.heads != m.hidden) {
    throw std::invalid_argument(fmt::format(
        "config.json: head_dim {} x {} heads != hidden_size {}; the planner models head_dim = hidden / heads",
        j["head_dim"].get<int64_t>(), m.heads, m.hidden));
  }
  return m;
}

}  // namespace

ModelSpec model_from_hf_config(const nlohmann::json& j, const std::string& name) {
  const std::string type = j.value("model_type", "");
  ModelSpec m;
  if (type == "gpt2") {
    m = preset("gpt-tiny");
    m.vocab = field<int64_t>(j, "vocab_size");
    m.seq = field<int64_t>(j, "n_positions");
    m.hidden = field<int64_t>(j, "n_embd");
    m.layers = field<int64_t>(j, "n_layer");
    m.heads = m.kv_heads = field<int64_t>(j, "n_head");
    m.ffn = j.contains("n_inner") && !j["n_inner"].is_null() ? j["n_inner"].get<int64_t>() : 4 * m.hidden;
    m.norm_eps = j.value("layer_norm_epsilon", 1e-5);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3") {
    m = llama_family(j);
  } else if (type == "mixtral") {
    m = llama_family(j);
    m.experts = field<int64_t>(j, "num_local_experts");
    m.top_k = field<int64_t>(j, "num_experts_per_tok");
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    m = llama_family(j);
    m.experts = field<int64_t>(j, "num_experts");
    m.top_k = field<int64_t>(j, "num_experts_per_tok");
    m.expert_ffn = field<int64_t>(j, "moe_intermediate_size");
    m.moe_every = j.value("decoder_sparse_step", 1);
    const int64_t shared = j.value("shared_expert_intermediate_size", int64_t{0});
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
