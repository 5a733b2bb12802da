// Model shapes for the planner (and, later, the model presets): plain data, no
// libtorch, so a 1T-parameter plan runs on a laptop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::plan {

enum class Norm { LayerNorm, RMSNorm };
enum class Position { Learned, RoPE };
enum class Activation { GELU, SwiGLU };
// How attention is computed (the same function either way):
//   Naive: the s x t scores materialised (ATen ops);
//   Tiled: meshtrain's CPU kernel (nn/tiled_attention.h): no scores, the tiles above the
//          causal diagonal skipped, packed-document masks and keyed dropout;
//   Sdpa:  at::scaled_dot_product_attention (the CPU flash kernel; flash / memory-efficient /
//          cuDNN on CUDA): causal, no dropout, no document masks, memory linear in the sequence;
//   Auto (the default): sdpa wherever it computes the case (no dropout, no document mask, and
//          on CPU cp = 1), else tiled for documents or from four tiles of keys on
//          (kAutoTiledKeys), else naive.
// On this project's 2-core CPUs (docs/bench-attention.md) sdpa ran 1.0-1.5x naive's speed at GPT-2's
// shape (12 heads, batch 4) up to 512 keys and 1.8-6.4x at 1024 (run to run), faster than the tiled
// kernel at every length, and memory linear in the sequence like it; a GPT-2 124M training step at seq 64 went
// from 1.7-1.9 s to 1.5 s (2026-12-06, AMD EPYC, bench/train.sh).
enum class AttentionImpl { Naive, Tiled, Auto, Sdpa };
// The tiled kernel's default tile (nn::TiledAttentionOptions' block_q and block_k).
constexpr int64_t kAttentionTile = 512;
constexpr int64_t kAutoTiledKeys = 4 * kAttentionTile;
AttentionImpl parse_attention(const std::string& s);  // "naive" | "tiled" | "sdpa" | "auto"; throws naming it
const char* attention_name(AttentionImpl a);
// Whether `a` computes tiled over `keys` keys; `documents`: a packed-document mask (tiled only).
bool attention_tiled(AttentionImpl a, int64_t keys, bool documents = false);
// Whether `a` computes through sdpa: attention dropout `dropout`, a document mask, cp ranks, on CUDA.
// (Decoding after cached keys takes another path: sdpa's causal mask starts at the first key.)
bool attention_sdpa(AttentionImpl a, double dropout, bool documents, int cp, bool cuda);

struct ModelSpec {
  std::string name;
  int64_t vocab = 0;
  int64_t seq = 0;  // maximum sequence length (learned positions have this many rows)
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // == heads: MHA; 1: MQA; between: GQA
  int64_t ffn = 0;       // FFN hidden size (per expert for MoE)
  Norm norm = Norm::LayerNorm;
  Position position = Position::Learned;
  Activation activation = Activation::GELU;
  AttentionImpl attention = AttentionImpl::Auto;
  bool tied = true;       // output head shares the embedding
  bool bias = true;       // linear layers have biases
  double dropout = 0.1;   // > 0: dropout masks are stored (1 byte per element)
  double init_std = 0.02;  // normal init of weights; output projections get std / sqrt(2 layers)
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Mixture of experts (0 = dense, moe/layer.h): the FFN of every
  // `moe_every`-th layer (layer i when i % moe_every == 0, Megatron-Core's
  // moe_layer_freq) becomes `experts` routed experts of width `expert_ffn`
  // (0: ffn), `top_k` of them per token, plus `shared_experts` always-on ones
  // (DeepSeekMoE, arXiv 2401.06066) computed as one FFN of shared_experts x
  // expert_ffn. Router: "softmax" or "sigmoid"; capacity_factor 0: dropless.
  // The auxiliary load-balancing loss and the router z-loss are added with
  // their coefficients.
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t moe_every = 1;
  int64_t shared_experts = 0;
  int64_t expert_ffn = 0;
  double capacity_factor = 0;
  std::string router = "softmax";
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0;

  int64_t head_dim() const { return hidden / heads; }
  bool moe() const { return experts > 0; }
  bool moe_layer(int64_t i) const { return moe() && i % moe_every == 0; }
  // MoE layers before layer i (a MoE layer's index among them), and in all.
  int64_t moe_layers_before(int64_t i) const { return moe() ? (i + moe_every - 1) / moe_every : 0; }
  int64_t moe_layer_count() const { return moe_layers_before(layers); }
  int64_t expert_width() const { return expert_ffn > 0 ? expert_ffn : ffn; }
};

// Checks divisibility and positivity; throws std::invalid_argument naming the field.
void validate(const ModelSpec& m);

// Published shapes: GPT-2, GPT-3 175B, Llama 2/3, the Megatron-LM paper's
// (arXiv 2104.04473 Table 1) and Korthikanti et al.'s (arXiv 2205.05198) series,
// and small ones for tests. Throws std::invalid_argument listing the names.
const ModelSpec& preset(const std::string& name);
std::vector<std::string> preset_names();

// The vocabulary rounded up to a multiple of `multiple` (e.g. 128 x tp).
int64_t padded_vocab(int64_t vocab, int64_t multiple);

}  // namespace meshtrain::plan
