// Exact parameter counts and FLOPs per token for decoder-only transformers.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

// One transformer layer, split the way the runtime splits it: tensor
// parallelism splits attention and the dense FFN; a MoE layer's routed experts
// (moe/layer.h: no biases, not split by tp) are split across ep instead.
struct LayerParams {
  int64_t attention = 0;  // q, k, v, o weights (+ their biases)
  int64_t mlp = 0;        // the dense FFN (a MoE layer: its shared experts, shared x expert_ffn wide)
  int64_t norms = 0;      // the two norms
  int64_t router = 0;     // MoE gate, h x E
  int64_t expert = 0;     // MoE: the routed experts' weights, E x (2 or 3) h f_e; every tp rank holds its ep share
  int64_t tp_sharded = 0;     // split across tp: weights and column-parallel biases
  int64_t tp_replicated = 0;  // every tp rank holds them: norms, row-parallel biases, router
  int64_t total() const { return attention + mlp + norms + router + expert; }
  // On one rank of a tp x ep mesh.
  double per_rank(int tp, int ep) const {
    return static_cast<double>(tp_sharded) / tp + static_cast<double>(tp_replicated) + static_cast<double>(expert) / ep;
  }
};

struct ParamCount {
  LayerParams layer;        // a dense layer
  LayerParams moe_layer;    // a MoE layer (spec.moe_layer(i)); all zero for a dense model
  int64_t moe_layers = 0;   // how many of the layers are MoE
  const LayerParams& of(const ModelSpec& m, int64_t i) const { return m.moe_layer(i) ? moe_layer : layer; }
  // Layers [first, last) on one rank of a tp x ep mesh.
  double layers_per_rank(const ModelSpec& m, int64_t first, int64_t last, int tp, int ep) const {
    double n = 0;
    for (int64_t i = first; i < last; ++i) n += of(m, i).per_rank(tp, ep);
    return n;
  }
  int64_t vocab_padded = 0;
  int64_t embedding = 0;    // vocab_padded x h (vocab-parallel)
  int64_t positions = 0;    // learned: seq x h
  int64_t final_norm = 0;
  int64_t head = 0;         // untied output head, vocab_padded x h; 0 when tied
  int64_t total = 0;        // everything, counted once
  int64_t active = 0;       // touched per token (top_k routed experts of each MoE layer)
  int64_t matmul_active = 0;  // weights multiplied per token (incl. the head), for FLOPs
};

// `vocab_multiple`: the vocabulary is padded to a multiple of it (e.g. 128 x tp).
ParamCount count_params(const ModelSpec& m, int64_t vocab_multiple = 1);

// Attention-score FLOPs convention: Full counts the whole s x s square (PaLM,
// arXiv 2204.02311 App. B, and Megatron's 72BLsh^2(1 + s/6h + V/12hL));
// Causal counts half of it (the masked half is skipped by flash kernels).
enum class AttnFlops { Full, Causal };

// Model FLOPs to train on one token at sequence length `seq`: 3 x forward, with
// forward = 2 x matmul_active + (4 or 2) x L x seq x heads x head_dim.
double train_flops_per_token(const ModelSpec& m, int64_t seq, AttnFlops conv = AttnFlops::Full);
// The formula above in words, for printing beside every MFU.
std::string flops_formula(AttnFlops conv);

// Adapter training (LoRA, QLoRA) on a frozen base: the base's weight gradients are never
// computed, so per token 2 x matmul_active (forward) + 2 x matmul_active (input gradients)
// + 6 x adapter_params + the attention's 3 passes (its backward is all input gradients).
double adapter_train_flops_per_token(const ModelSpec& m, int64_t seq, int64_t adapter_params,
                                     AttnFlops conv = AttnFlops::Full);
std::string adapter_flops_formula(AttnFlops conv);

}  // namespace meshtrain::plan
