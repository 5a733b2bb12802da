// A model's shape from a Hugging Face config.json, for the planner (and for
// ckpt/hf.h, which converts weights of the gpt2 and llama types only), and
// the shape flags of `meshtrain plan` applied on top of any shape.
//
// Types read: gpt2; llama, mistral, qwen2, qwen3 (RMSNorm, RoPE, SwiGLU);
// mixtral, qwen2_moe, qwen3_moe (routed experts, shared ones where the config
// has them). The planner models attention with head_dim = hidden / heads and
// biases on every linear or on none: a config that says otherwise (an
// explicit head_dim that differs, DeepSeek's MLA) is refused by name rather
// than planned wrong. Qwen2's q/k/v biases are left out (0.01% of 7B's
// parameters).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

// Throws std::invalid_argument naming the missing field or the unsupported type / feature.
ModelSpec model_from_hf_config(const nlohmann::json& config, const std::string& name);
// Reads `path` (a config.json, or the directory holding one); errors name the file.
ModelSpec model_from_hf_config_file(const std::string& path);

// `meshtrain plan --layers ... --experts ...`: fields that replace the base shape's.
struct ShapeFlags {
  std::optional<int64_t> layers, hidden, heads, kv_heads, ffn, vocab, experts, top_k, expert_ffn;
  bool any() const;
};
// The base with the flags applied (kv_heads follows heads unless given; experts > 0 needs top_k), validated.
ModelSpec apply_shape_flags(ModelSpec base, const ShapeFlags& f);
// A model from the flags alone: a "gpt" (LayerNorm, learned positions, GELU, tied) or "llama" (RMSNorm, RoPE,
// SwiGLU, untied) layer; layers, hidden, heads, ffn and vocab must be given, and the sequence length.
ModelSpec model_from_flags(const std::string& family, const ShapeFlags& f, int64_t seq);

}  // namespace meshtrain::plan
