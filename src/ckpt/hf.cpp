#include "meshtrain/ckpt/hf.h"
#include "meshtrain/plan/hf_config.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/plan/count.h"
#include "meshtrain/plan/spec_json.h"

namespace meshtrain::ckpt {
namespace fs = std::filesystem;

HfFamily hf_family(const plan::ModelSpec& m) {
  if (m.norm == plan::Norm::LayerNorm && m.position == plan::Position::Learned &&
      m.activation == plan::Activation::GELU && m.bias && m.tied && m.kv_heads == m.heads && !m.moe()) {
    return HfFamily::Gpt2;
  }
  const bool llama = m.norm == plan::Norm::RMSNorm && m.position == plan::Position::RoPE &&
                     m.activation == plan::Activation::SwiGLU && !m.bias;
  if (llama && !m.moe()) return HfFamily::Llama;
  if (!llama) {
    throw std::invalid_argument(fmt::format(
        "model '{}' is neither GPT-2 shaped (LayerNorm, learned positions, GELU, biases, tied head, kv heads = heads) "
        "nor Llama shaped (RMSNorm, RoPE, SwiGLU, no biases): no Hugging Face class holds it",
        m.name));
  }
  // Mixtral: every layer's MLP is the routed experts alone, gated by the renormalised top k of a softmax.
  const char* unlike = m.moe_every != 1        ? "dense layers between MoE layers (moe_every > 1)"
                       : m.shared_experts != 0 ? "shared experts"
                       : m.router != "softmax" ? "a sigmoid router"
                       : m.top_k < 2 ? "top_k = 1 (Mixtral renormalises the chosen gates, so its single gate is 1; "
                                       "meshtrain's stays the softmax probability)"
                                     : nullptr;
  if (unlike) {
    throw std::invalid_argument(fmt::format("MoE model '{}' has {}, which MixtralForCausalLM does not hold: no Hugging "
                                            "Face class computes it",
                                            m.name, unlike));
  }
  return HfFamily::Mixtral;
}

namespace {

// One tensor of `from` by name, checked against the shape it must have.
at::Tensor take(const std::map<std::string, at::Tensor>& from, const std::string& name,
                const std::vector<int64_t>& shape, const char* side) {
  auto it = from.find(name);
  if (it == from.end()) throw std::invalid_argument(fmt::format("{} tensor {} is missing", side, name));
  if (it->second.sizes().vec() != shape) {
    throw std::invalid_argument(fmt::format("{} tensor {} has shape {}, expected {}", side, name,
                                            fmt::join(it->second.sizes(), "x"), fmt::join(shape, "x")));
  }
  return it->second.contiguous();
}

// The table of hf.h as code: for each direction, the same walk over the model.
struct Mapper {
  const plan::ModelSpec& m;
  bool to_hf;  // ours -> HF
  const std::map<std::string, at::Tensor>& in;
  std::map<std::string, at::Tensor> out;
  const char* side() const { return to_hf ? "meshtrain" : "Hugging Face"; }

  // Experts stacked on our side [E, ...], one tensor per expert on the Hub's (`hf` holds {} for e).
  void per_expert(const std::string& ours, const std::string& hf, int64_t experts, const std::vector<int64_t>& shape) {
    std::vector<int64_t> stacked{experts};
    stacked.insert(stacked.end(), shape.begin(), shape.end());
    if (to_hf) {
      const at::Tensor all = take(in, ours, stacked, side());
      for (int64_t e = 0; e < experts; ++e) out[fmt::format(fmt::runtime(hf), e)] = all[e].contiguous();
    } else {
      std::vector<at::Tensor> each;
      for (int64_t e = 0; e < experts; ++e) each.push_back(take(in, fmt::format(fmt::runtime(hf), e), shape, side()));
      out[ours] = at::stack(each);
    }
  }
  // A tensor with the same layout on both sides.
  void same(const std::string& ours, const std::string& hf, const std::vector<int64_t>& shape) {
    if (to_hf) out[hf] = take(in, ours, shape, side());
    else out[ours] = take(in, hf, shape, side());
  }
  // GPT-2's Conv1D: ours [out, in], HF's [in, out].
  void transposed(const std::string& ours, const std::string& hf, int64_t rows_out, int64_t cols_in) {
    if (to_hf) out[hf] = take(in, ours, {rows_out, cols_in}, side()).t().contiguous();
    else out[ours] = take(in, hf, {cols_in, rows_out}, side()).t().contiguous();
  }
  // GPT-2's fused c_attn: q, k, v concatenated along out (then transposed for the weight).
  void fused_qkv(const std::string& ours, const std::string& hf, int64_t h) {
    const std::string q = ours + "q.", k = ours + "k.", v = ours + "v.";
    if (to_hf) {
      out[hf + "weight"] = at::cat({take(in, q + "weight", {h, h}, side()), take(in, k + "weight", {h, h}, side()),
                                    take(in, v + "weight", {h, h}, side())})
                               .t()
                               .contiguous();
      out[hf + "bias"] = at::cat({take(in, q + "bias", {h}, side()), take(in, k + "bias", {h}, side()),
                                  take(in, v + "bias", {h}, side())});
    } else {
      const auto w = take(in, hf + "weight", {h, 3 * h}, side()).t().chunk(3, 0);
      const auto b = take(in, hf + "bias", {3 * h}, side()).chunk(3, 0);
      const char* parts[] = {"q.", "k.", "v."};
      for (int i = 0; i < 3; ++i) {
        out[ours + parts[i] + "weight"] = w[i].contiguous();
        out[ours + parts[i] + "bias"] = b[i].contiguous();
      }
    }
  }

  void run() {
    const int64_t h = m.hidden, V = m.vocab, f = m.ffn, d = m.head_dim();
    if (hf_family(m) == HfFamily::Gpt2) {
      same("embed.weight", "transformer.wte.weight", {V, h});
      same("pos.weight", "transformer.wpe.weight", {m.seq, h});
      for (int64_t l = 0; l < m.layers; ++l) {
        const std::string o = fmt::format("layers.{}.", l), g = fmt::format("transformer.h.{}.", l);
        for (const char* x : {"weight", "bias"}) {
          same(o + "norm1." + x, g + "ln_1." + x, {h});
          same(o + "norm2." + x, g + "ln_2." + x, {h});
        }
        fused_qkv(o + "attn.", g + "attn.c_attn.", h);
        transposed(o + "attn.o.weight", g + "attn.c_proj.weight", h, h);
        same(o + "attn.o.bias", g + "attn.c_proj.bias", {h});
        transposed(o + "mlp.fc1.weight", g + "mlp.c_fc.weight", f, h);
        same(o + "mlp.fc1.bias", g + "mlp.c_fc.bias", {f});
        transposed(o + "mlp.fc2.weight", g + "mlp.c_proj.weight", h, f);
        same(o + "mlp.fc2.bias", g + "mlp.c_proj.bias", {h});
      }
      same("final_norm.weight", "transformer.ln_f.weight", {h});
      same("final_norm.bias", "transformer.ln_f.bias", {h});
      return;
    }
    const bool moe = hf_family(m) == HfFamily::Mixtral;
    same("embed.weight", "model.embed_tokens.weight", {V, h});
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string o = fmt::format("layers.{}.", l), g = fmt::format("model.layers.{}.", l);
      same(o + "norm1.weight", g + "input_layernorm.weight", {h});
      same(o + "attn.q.weight", g + "self_attn.q_proj.weight", {m.heads * d, h});
      same(o + "attn.k.weight", g + "self_attn.k_proj.weight", {m.kv_heads * d, h});
      same(o + "attn.v.weight", g + "self_attn.v_proj.weight", {m.kv_heads * d, h});
      same(o + "attn.o.weight", g + "self_attn.o_proj.weight", {h, m.heads * d});
      same(o + "norm2.weight", g + "post_attention_layernorm.weight", {h});
      if (moe) {
        const int64_t E = m.experts, w = m.expert_width();
        same(o + "moe.router.weight", g + "block_sparse_moe.gate.weight", {E, h});
        per_expert(o + "moe.experts.w1", g + "block_sparse_moe.experts.{}.w1.weight", E, {w, h});
        per_expert(o + "moe.experts.w3", g + "block_sparse_moe.experts.{}.w3.weight", E, {w, h});
        per_expert(o + "moe.experts.w2", g + "block_sparse_moe.experts.{}.w2.weight", E, {h, w});
        continue;
      }
      same(o + "mlp.gate.weight", g + "mlp.gate_proj.weight", {f, h});
      same(o + "mlp.up.weight", g + "mlp.up_proj.weight", {f, h});
      same(o + "mlp.down.weight", g + "mlp.down_proj.weight", {h, f});
    }
    same("final_norm.weight", "model.norm.weight", {h});
    if (!m.tied) same("head.weight", "lm_head.weight", {V, h});
  }
};

}  // namespace

std::map<std::string, at::Tensor> to_hf(const std::map<std::string, at::Tensor>& ours, const plan::ModelSpec& m) {
  Mapper mp{m, true, ours, {}};
  mp.run();
  return mp.out;
}

std::map<std::string, at::Tensor> from_hf(const std::map<std::string, at::Tensor>& hf, const plan::ModelSpec& m) {
  Mapper mp{m, false, hf, {}};
  mp.run();
  return mp.out;
}

nlohmann::json hf_config(const plan::ModelSpec& m) {
  if (hf_family(m) == HfFamily::Gpt2) {
    return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab},
            {"n_positions", m.seq}, {"n_ctx", m.seq}, {"n_embd", m.hidden}, {"n_layer", m.layers},
            {"n_head", m.heads}, {"n_inner", m.ffn}, {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", m.norm_eps}, {"tie_word_embeddings", true}, {"torch_dtype", "float32"},
            // meshtrain's dropout where GPT-2 has it (transformers' default is 0.1 in training mode)
            {"embd_pdrop", m.dropout}, {"resid_pdrop", m.dropout}, {"attn_pdrop", m.dropout}};
  }
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab},
                      {"hidden_size", m.hidden}, {"intermediate_size", m.ffn}, {"num_hidden_layers", m.layers},
                      {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads},
                      {"max_position_embeddings", m.seq}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
                      {"tie_word_embeddings", m.tied}, {"hidden_act", "silu"}, {"attention_bias", false},
                      {"attention_dropout", m.dropout}, {"torch_dtype", "float32"}};
  if (hf_family(m) == HfFamily::Mixtral) {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j.erase("attention_bias");
    j["intermediate_size"] = m.expert_width();
    j["num_local_experts"] = m.experts;
    j["num_experts_per_tok"] = m.top_k;
    j["router_aux_loss_coef"] = m.aux_loss_coef;
    j["router_jitter_noise"] = 0.0;
    j["output_router_logits"] = false;
    j["sliding_window"] = nullptr;
  }
  return j;
}

namespace {

// A config.json field that changes what the model computes, and the values meshtrain computes.
struct Modelled {
  const char* key;
  std::vector<nlohmann::json> values;  // null stands for the key absent
  const char* what;                    // what another value would change
};

// Each field that changes the computation and that meshtrain does not model must hold a value
// meshtrain computes (or be absent): anything else is one error naming the key, never a model
// imported with a part dropped (biases left out, rope scaling ignored).
void check_modelled(const nlohmann::json& j, const std::string& type) {
  const nlohmann::json null;
  const std::vector<Modelled> gpt2{
      {"activation_function", {null, "gelu_new", "gelu_pytorch_tanh", "gelu_fast"}, "the MLP's activation (meshtrain: GELU, tanh form)"},
      {"scale_attn_weights", {null, true}, "the 1/sqrt(head_dim) scaling of attention scores"},
      {"scale_attn_by_inverse_layer_idx", {null, false}, "an extra 1/(layer+1) scaling of attention scores"},
      {"add_cross_attention", {null, false}, "cross-attention blocks"},
      {"tie_word_embeddings", {null, true}, "an output projection apart from the embedding"}};
  const std::vector<Modelled> llama{
      {"hidden_act", {null, "silu", "swish"}, "the MLP's activation (meshtrain: SwiGLU)"},
      {"attention_bias", {null, false}, "biases on the q, k, v and o projections"},
      {"mlp_bias", {null, false}, "biases on the MLP's projections"},
      {"sliding_window", {null}, "sliding-window attention"}};
  std::vector<Modelled> mixtral = llama;
  mixtral.push_back({"router_jitter_noise", {null, 0, 0.0}, "multiplicative noise on the router's input in training"});
  if (type == "mixtral" && j.value("num_experts_per_tok", nlohmann::json()) == 1) {
    throw std::invalid_argument("config.json: \"num_experts_per_tok\" = 1: Mixtral renormalises a token's one gate to 1, "
                                "meshtrain keeps it the router's softmax probability; a top-1 Mixtral is refused");
  }
  for (const Modelled& f : type == "gpt2" ? gpt2 : type == "llama" ? llama : mixtral) {
    const nlohmann::json& v = j.contains(f.key) ? j[f.key] : null;
    if (std::find(f.values.begin(), f.values.end(), v) != f.values.end()) continue;
    throw std::invalid_argument(fmt::format("config.json: \"{}\" = {} sets {}, which meshtrain does not model; "
                                            "importing it would compute another model, so it is refused",
                                            f.key, v.dump(), f.what));
  }
  // Rotary positions: 4.x writes rope_scaling (null unless scaled), 5.x rope_parameters
  // ({"rope_type": "default", "rope_theta": ...}); any other type scales positions.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (type == "gpt2" || !j.contains(key) || j[key].is_null()) continue;
    const nlohmann::json& r = j[key];
    if (!r.is_object()) throw std::invalid_argument(fmt::format("config.json: \"{}\" is {}, not an object", key, r.dump()));
    for (const auto& [name, v] : r.items()) {
      if ((name == "rope_theta" && std::string(key) == "rope_parameters") || ((name == "rope_type" || name == "type") && v == "default") ||
          (name == "partial_rotary_factor" && v == 1.0)) {
        continue;
      }
      throw std::invalid_argument(fmt::format("config.json: \"{}\" holds \"{}\" = {}: rotary position scaling, which "
                                              "meshtrain does not model; importing it would compute another model, so "
                                              "it is refused",
                                              key, name, v.dump()));
    }
  }
}

}  // namespace

plan::ModelSpec spec_from_hf_config(const nlohmann::json& j) {
  const std::string type = j.is_object() ? j.value("model_type", "") : "";
  if (type != "gpt2" && type != "llama" && type != "mixtral") {
    throw std::invalid_argument(
        fmt::format("Hugging Face model_type \"{}\": meshtrain reads gpt2, llama and mixtral", type));
  }
  check_modelled(j, type);
  plan::ModelSpec m = plan::model_from_hf_config(j, "hf-" + type);
  if (type == "mixtral") {
    const nlohmann::json coef = j.value("router_aux_loss_coef", nlohmann::json(0.001));  // transformers' default
    if (!coef.is_number()) {
      throw std::invalid_argument(fmt::format("config.json: \"router_aux_loss_coef\" is {}, not a number", coef.dump()));
    }
    m.aux_loss_coef = coef.get<double>();
    m.z_loss_coef = 0;
    m.capacity_factor = 0;  // Mixtral routes every token
  }
  return m;
}

void export_hf(const std::string& step_dir, const std::string& out_dir, bool force, const HfTokenizer* tokenizer) {
  if (fs::exists(out_dir) && !force) throw std::runtime_error(fmt::format("{} exists; pass --force to replace it", out_dir));
  Reader reader(step_dir);
  const auto& man = reader.manifest();
  if (!man.contains("config") || !man["config"].contains("model")) {
    throw std::runtime_error(fmt::format("{}: the manifest has no model config to export", step_dir));
  }
  const plan::ModelSpec m = spec_from_json(man["config"]["model"]);
  if (hf_family(m) == HfFamily::Mixtral && m.capacity_factor > 0) {  // (fails before reading for no family)
    fmt::print(stderr,
               "note: model.capacity_factor = {}: meshtrain's router drops assignments past an expert's capacity, "
               "MixtralForCausalLM routes every token; their logits differ wherever an expert overflows\n",
               m.capacity_factor);
  }
  if (tokenizer) check_hf_tokenizer(*tokenizer, m.vocab);
  const std::map<std::string, at::Tensor> ours = model_weights(reader);  // LoRA merged
  for (const auto& [name, t] : ours) {
    if (name.find(".adapter_") != std::string::npos) {
      throw std::runtime_error(fmt::format("{}: {} is a bottleneck adapter, which no Hugging Face model class holds; "
                                           "export it in meshtrain's format",
                                           step_dir, name));
    }
  }
  std::vector<NamedTensor> tensors;
  for (auto& [name, t] : to_hf(ours, m)) tensors.push_back({name, t});
  const std::string tmp = out_dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_safetensors((fs::path(tmp) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  nlohmann::json config = hf_config(m);
  config["bos_token_id"] = nullptr;
  config["eos_token_id"] = nullptr;
  if (tokenizer) write_hf_tokenizer(*tokenizer, m.vocab, m.seq, tmp, config);
  std::ofstream(fs::path(tmp) / "config.json") << config.dump(2) << "\n";
  fs::remove_all(out_dir);
  fs::rename(tmp, out_dir);
}

namespace {

// The tensors of a Hugging Face directory: model.safetensors, or the files a sharded save's
// model.safetensors.index.json maps every tensor to (each read once).
std::map<std::string, at::Tensor> read_hf_tensors(const fs::path& dir) {
  std::vector<fs::path> files{dir / "model.safetensors"};
  if (!fs::exists(files[0])) {
    const fs::path index = dir / "model.safetensors.index.json";
    nlohmann::json j;
    try {
      std::ifstream(index) >> j;
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(fmt::format("{}: not a safetensors index ({})", index.string(), e.what()));
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw std::runtime_error(fmt::format("{} has no \"weight_map\" object", index.string()));
    }
    files.clear();
    for (const auto& [name, file] : j["weight_map"].items()) {
      const fs::path f = dir / (file.is_string() ? file.get<std::string>() : std::string());
      if (!file.is_string() || fs::path(file.get<std::string>()).has_parent_path() || !fs::exists(f)) {
        throw std::runtime_error(fmt::format("{}: tensor {} maps to {}, which is not a file beside it", index.string(),
                                             name, file.dump()));
      }
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
  }
  std::map<std::string, at::Tensor> hf;
  for (const fs::path& f : files) {
    SafetensorsFile file(f.string());
    for (const auto& [name, e] : file.entries()) {
      if (!hf.emplace(name, file.get(name).to(at::kFloat)).second) {
        throw std::runtime_error(fmt::format("{}: tensor {} is in more than one file", dir.string(), name));
      }
    }
  }
  return hf;
}

}  // namespace

void import_hf(const std::string& hf_dir, const std::string& out_dir, bool force) {
  const fs::path cfg = fs::path(hf_dir) / "config.json";
  if (!fs::exists(cfg) || (!fs::exists(fs::path(hf_dir) / "model.safetensors") &&
                           !fs::exists(fs::path(hf_dir) / "model.safetensors.index.json"))) {
    throw std::runtime_error(fmt::format("{}: a Hugging Face model directory holds config.json and model.safetensors "
                                         "(or model.safetensors.index.json and its shards)",
                                         hf_dir));
  }
  if (fs::exists(out_dir) && !force) throw std::runtime_error(fmt::format("{} exists; pass --force to replace it", out_dir));
  nlohmann::json j;
  try {
    std::ifstream(cfg) >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not JSON ({})", cfg.string(), e.what()));
  }
  plan::ModelSpec m;
  try {
    m = spec_from_hf_config(j);
  } catch (const std::invalid_argument& e) {  // which directory's config.json the refusal is about
    throw std::invalid_argument(fmt::format("{}: {}", hf_dir, e.what()));
  } catch (const nlohmann::json::exception& e) {  // a field of another type than transformers writes
    throw std::runtime_error(fmt::format("{}: {}", cfg.string(), e.what()));
  }
  const std::map<std::string, at::Tensor> hf = read_hf_tensors(hf_dir);
  const std::map<std::string, at::Tensor> ours = from_hf(hf, m);
  // A one-rank checkpoint: every tensor whole, written by this process alone.
  std::vector<Piece> pieces;
  for (const auto& [name, t] : ours) pieces.push_back({"model/" + name, t, t.sizes().vec(), std::vector<int64_t>(t.dim(), 0), true});
  if (force) fs::remove_all(out_dir);
  Comm solo("import", 0);
  Checkpointer saver(SaveOptions{out_dir, 1, false}, solo);
  saver.save(0, pieces,
             {{"config", {{"model", spec_to_json(m)}}}, {"source", fmt::format("Hugging Face {}", hf_dir)},
              {"optimizer", {{"steps", 0}}}},
             nlohmann::json::object());
  saver.finish();
}

}  // namespace meshtrain::ckpt
