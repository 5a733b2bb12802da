// Exact parameter counts and FLOPs per token for decoder-only transformers.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

// One transformer layer, split the way tensor parallelism splits it.
struct LayerParams {
  int64_t attention = 0;  // q, k, v, o weights (+ their biases)
  int64_t mlp = 0;        // all experts' weights and biases for MoE
  int64_t norms = 0;      // the two norms
  int64_t router = 0;     // MoE gate, h x E
  int64_t tp_sharded = 0;     // split across tp: weights and column-parallel biases
  int64_t tp_replicated = 0;  // every tp rank holds them: norms, row-parallel biases, router
  int64_t expert = 0;         // of the sharded part, expert weights (split across ep too)
  int64_t total() const { return attention + mlp + norms + router; }
};

struct ParamCount {
  LayerParams layer;
  int64_t vocab_padded = 0;
  int64_t embedding = 0;    // vocab_padded x h (vocab-parallel)
  int64_t positions = 0;    // learned: seq x h
  int64_t final_norm = 0;
  int64_t head = 0;         // untied output head, vocab_padded x h; 0 when tied
  int64_t total = 0;        // everything, counted once
  int64_t active = 0;       // touched per token (top_k experts for MoE)
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

}  // namespace meshtrain::plan
