#include "meshtrain/plan/spec_json.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace meshtrain {
namespace {

template <class E>
struct Names {
  const char* name;
  E value;
};
constexpr Names<plan::Norm> kNorms[] = {{"layernorm", plan::Norm::LayerNorm}, {"rmsnorm", plan::Norm::RMSNorm}};
constexpr Names<plan::Position> kPositions[] = {{"learned", plan::Position::Learned}, {"rope", plan::Position::RoPE}};
constexpr Names<plan::Activation> kActs[] = {{"gelu", plan::Activation::GELU}, {"swiglu", plan::Activation::SwiGLU}};

template <class E, size_t N>
const char* name_of(const Names<E> (&table)[N], E v) {
  for (const auto& n : table)
    if (n.value == v) return n.name;
  return "?";
}
template <class E, size_t N>
E value_of(const Names<E> (&table)[N], const std::string& s, const char* field) {
  for (const auto& n : table)
    if (s == n.name) return n.value;
  throw std::invalid_argument(fmt::format("model.{} '{}' unknown", field, s));
}

}  // namespace

nlohmann::json spec_to_json(const plan::ModelSpec& m) {
  return {{"name", m.name},         {"vocab", m.vocab},         {"seq", m.seq},
          {"layers", m.layers},     {"hidden", m.hidden},       {"heads", m.heads},
          {"kv_heads", m.kv_heads}, {"ffn", m.ffn},             {"norm", name_of(kNorms, m.norm)},
          {"position", name_of(kPositions, m.position)},        {"activation", name_of(kActs, m.activation)},
          {"tied", m.tied},         {"bias", m.bias},           {"dropout", m.dropout},
          {"init_std", m.init_std}, {"norm_eps", m.norm_eps},   {"rope_theta", m.rope_theta},
          {"experts", m.experts},   {"top_k", m.top_k},         {"attention", plan::attention_name(m.attention)},
          {"moe_every", m.moe_every}, {"shared_experts", m.shared_experts}, {"expert_ffn", m.expert_ffn},
          {"capacity_factor", m.capacity_factor}, {"router", m.router}, {"aux_loss_coef", m.aux_loss_coef},
          {"z_loss_coef", m.z_loss_coef}};
}

plan::ModelSpec spec_from_json(const nlohmann::json& j) {
  plan::ModelSpec m;
  try {
    m.name = j.at("name");
    m.vocab = j.at("vocab");
    m.seq = j.at("seq");
    m.layers = j.at("layers");
    m.hidden = j.at("hidden");
    m.heads = j.at("heads");
    m.kv_heads = j.at("kv_heads");
    m.ffn = j.at("ffn");
    m.norm = value_of(kNorms, j.at("norm").get<std::string>(), "norm");
    m.position = value_of(kPositions, j.at("position").get<std::string>(), "position");
    m.activation = value_of(kActs, j.at("activation").get<std::string>(), "activation");
    m.tied = j.at("tied");
    m.bias = j.at("bias");
    m.dropout = j.at("dropout");
    m.init_std = j.at("init_std");
    m.norm_eps = j.at("norm_eps");
    m.rope_theta = j.at("rope_theta");
    m.experts = j.value("experts", int64_t{0});
    m.top_k = j.value("top_k", int64_t{0});
    m.moe_every = j.value("moe_every", int64_t{1});
    m.shared_experts = j.value("shared_experts", int64_t{0});
    m.expert_ffn = j.value("expert_ffn", int64_t{0});
    m.capacity_factor = j.value("capacity_factor", 0.0);
    m.router = j.value("router", std::string("softmax"));
    m.aux_loss_coef = j.value("aux_loss_coef", 0.01);
    m.z_loss_coef = j.value("z_loss_coef", 0.0);
    m.attention = plan::parse_attention(j.value("attention", std::string("naive")));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("model description in the checkpoint is incomplete: {}", e.what()));
  }
  return m;
}

}  // namespace meshtrain
