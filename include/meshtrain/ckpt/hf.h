// Hugging Face interchange for the three families meshtrain's Transformer covers:
// GPT2LMHeadModel (LayerNorm, learned positions, GELU-tanh, biases, tied head),
// LlamaForCausalLM (RMSNorm, RoPE with rotate-half, SwiGLU, no biases) and
// MixtralForCausalLM (Llama with a routed SwiGLU MoE in every layer's place of
// the MLP: softmax over the experts, the top k >= 2 renormalised; no shared
// experts). The export writes the Hub's layout (one tensor per expert), which
// transformers 5 fuses on load and writes back on save_pretrained.
//
// The name and layout table (ours: model/transformer.h; L = layer index):
//
//   meshtrain                         GPT2LMHeadModel                       layout
//   embed.weight [V, h]               transformer.wte.weight [V, h]         same
//   pos.weight [S, h]                 transformer.wpe.weight [S, h]         same
//   layers.L.norm1.{weight,bias}      transformer.h.L.ln_1.{weight,bias}    same
//   layers.L.attn.{q,k,v}.weight      transformer.h.L.attn.c_attn.weight    Conv1D [in, out]: cat(q, k, v)ᵀ [h, 3h]
//   layers.L.attn.{q,k,v}.bias        transformer.h.L.attn.c_attn.bias      cat(q, k, v) [3h]
//   layers.L.attn.o.{weight,bias}     transformer.h.L.attn.c_proj.*         weight transposed [h, h]
//   layers.L.norm2.{weight,bias}      transformer.h.L.ln_2.*                same
//   layers.L.mlp.fc1.{weight,bias}    transformer.h.L.mlp.c_fc.*            weight transposed [h, ffn]
//   layers.L.mlp.fc2.{weight,bias}    transformer.h.L.mlp.c_proj.*          weight transposed [ffn, h]
//   final_norm.{weight,bias}          transformer.ln_f.*                    same
//   (tied: no head; GPT-2 files may hold lm_head.weight = wte, ignored on import)
//
//   meshtrain                         LlamaForCausalLM                      layout
//   embed.weight [V, h]               model.embed_tokens.weight             same
//   layers.L.norm1.weight             model.layers.L.input_layernorm.weight same
//   layers.L.attn.{q,k,v,o}.weight    model.layers.L.self_attn.{q,k,v,o}_proj.weight  same ([out, in])
//   layers.L.norm2.weight             model.layers.L.post_attention_layernorm.weight  same
//   layers.L.mlp.{gate,up,down}.weight model.layers.L.mlp.{gate,up,down}_proj.weight  same
//   final_norm.weight                 model.norm.weight                     same
//   head.weight [V, h] (untied)       lm_head.weight                        same
//
//   meshtrain (Mixtral: as Llama, but for the MLP; E experts, width f)
//   layers.L.moe.router.weight [E, h] model.layers.L.block_sparse_moe.gate.weight   same
//   layers.L.moe.experts.w1 [E, f, h] model.layers.L.block_sparse_moe.experts.e.w1.weight [f, h]  expert e's slice
//   layers.L.moe.experts.w3 [E, f, h] ... .experts.e.w3.weight [f, h] (up)   w1 is the gate: w2(silu(w1 x) * w3 x)
//   layers.L.moe.experts.w2 [E, h, f] ... .experts.e.w2.weight [h, f] (down)
//
// Capacity (model.capacity_factor > 0) is a limit meshtrain's router applies;
// MixtralForCausalLM routes every token, so the two compute the same logits
// only where no expert overflows (the export says so when it writes one).
//
// RoPE needs no permutation: meshtrain rotates halves as HF's Llama does (the
// q/k permutation in HF's conversion script maps Meta's interleaved layout to it).
// config.json carries the shape (GPT-2: vocab_size, n_positions, n_embd,
// n_layer, n_head, n_inner, layer_norm_epsilon, activation_function gelu_new;
// Llama: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, max_position_embeddings,
// rms_norm_eps, rope_theta, tie_word_embeddings, hidden_act silu; Mixtral:
// those, intermediate_size = the expert width, num_local_experts,
// num_experts_per_tok, router_aux_loss_coef, router_jitter_noise 0).
// Import reads model.safetensors or, for a sharded save, every file that
// model.safetensors.index.json's weight_map names.
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/hf_tokenizer.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain::ckpt {

enum class HfFamily { Gpt2, Llama, Mixtral };
// Throws std::invalid_argument naming what keeps the model out of every family.
HfFamily hf_family(const plan::ModelSpec& m);

// Full tensors by name (ours: vocabulary unpadded) -> HF names and layouts, and
// back. Each throws std::invalid_argument naming a missing or misshaped tensor.
std::map<std::string, at::Tensor> to_hf(const std::map<std::string, at::Tensor>& ours, const plan::ModelSpec& m);
std::map<std::string, at::Tensor> from_hf(const std::map<std::string, at::Tensor>& hf, const plan::ModelSpec& m);

nlohmann::json hf_config(const plan::ModelSpec& m);
// Throws std::invalid_argument for a model_type other than gpt2 / llama / mixtral, a missing
// field, or one that sets what meshtrain does not compute.
plan::ModelSpec spec_from_hf_config(const nlohmann::json& config);

// `meshtrain ckpt export --format hf`: OUT/model.safetensors + OUT/config.json
// from a checkpoint. `meshtrain ckpt import`: a one-rank meshtrain checkpoint
// (step 0; any mesh loads it with [init] from) from a Hugging Face directory
// holding config.json and model.safetensors. Neither overwrites without `force`.
// With a tokenizer the export carries it (ckpt/hf_tokenizer.h); without, config.json's
// bos/eos ids are null (not GPT-2's 50256, outside a small vocabulary).
void export_hf(const std::string& step_dir, const std::string& out_dir, bool force,
               const HfTokenizer* tokenizer = nullptr);
void import_hf(const std::string& hf_dir, const std::string& out_dir, bool force);

}  // namespace meshtrain::ckpt
