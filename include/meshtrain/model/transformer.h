// A decoder-only transformer (GPT-2 or Llama style, by its ModelSpec), built
// tensor-parallel over a `tp` group (size 1: the ordinary model).
//
//   tokens [b, s] -> embedding (+ learned positions) -> L x block -> final norm
//   -> head (tied to the embedding or not) -> vocab-parallel cross-entropy
//   block:  x += dropout(attention(norm1(x)));  x += dropout(mlp(norm2(x)))
//
// Attention is split by heads (q heads and kv heads across tp ranks), the MLP
// column-then-row: one all-reduce forward and one backward per sub-block
// (Megatron-LM). With sequence parallelism, norms, dropouts and residuals run
// on seq/tp rows, and the all-reduces become all-gather + reduce-scatter.
//
// Parameter names (also those of exported checkpoints):
//   embed.weight [V_pad, h], pos.weight [seq, h] (learned positions),
//   layers.{i}.norm1.{weight,bias}, layers.{i}.attn.{q,k,v,o}.{weight,bias},
//   layers.{i}.norm2.{weight,bias}, layers.{i}.mlp.{fc1,fc2}.{weight,bias} (GELU)
//   or layers.{i}.mlp.{gate,up,down}.weight (SwiGLU), final_norm.{weight,bias},
//   head.weight [V_pad, h] (untied only). Biases exist when spec.bias is set.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/model/profiler.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/parallel/tensor/layers.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain {

class Comm;

struct Block {
  at::Tensor norm1_w, norm1_b, norm2_w, norm2_b;
  ColumnParallelLinear q, k, v;
  RowParallelLinear o;
  ColumnParallelLinear fc1, gate, up;  // fc1 (GELU) or gate and up (SwiGLU)
  RowParallelLinear fc2;               // fc2 (GELU) or down (SwiGLU)
};

class Transformer {
 public:
  // Throws std::invalid_argument when the spec does not divide by tp (heads, kv
  // heads, ffn; the sequence with sequence parallelism).
  Transformer(const plan::ModelSpec& spec, Comm& tp, bool sequence_parallel, uint64_t seed);

  // Per-token loss [s, b] (fp32, the same on every tp rank). targets < 0 are ignored.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets, bool train = true);
  // Logits of this rank's vocabulary slice, [s, b, V_pad/tp].
  at::Tensor logits(const at::Tensor& tokens, bool train = false);

  // One block on hidden states [s(/tp), b, h] (for benchmarks and labs).
  at::Tensor block_forward(int64_t i, const at::Tensor& x, bool train);
  const Block& block(int64_t i) const { return blocks_.at(i); }

  // When set, forward records per-segment times (and backward, via markers).
  void set_profiler(SegmentProfiler* p) { profiler_ = p; }

  // After backward: sums the gradients sequence parallelism left partial
  // (norm weights, row-parallel biases, positions) over the tp group.
  void finalize_grads();

  ParamStore& params() { return store_; }
  const plan::ModelSpec& spec() const { return spec_; }
  int64_t padded_vocab() const { return padded_vocab_; }
  int64_t vocab_start() const { return embed_.vocab_start(); }

 private:
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  at::Tensor attention(const Block& blk, const at::Tensor& x, bool train) const;
  at::Tensor mlp(const Block& blk, const at::Tensor& x) const;
  at::Tensor hidden_states(const at::Tensor& tokens, bool train);

  plan::ModelSpec spec_;
  Comm& comm_;
  TensorParallel tp_;
  ParamStore store_;
  int64_t padded_vocab_;
  VocabParallelEmbedding embed_;
  at::Tensor pos_;
  std::vector<Block> blocks_;
  at::Tensor final_w_, final_b_;
  ColumnParallelLinear head_;
  SegmentProfiler* profiler_ = nullptr;
};

}  // namespace meshtrain
