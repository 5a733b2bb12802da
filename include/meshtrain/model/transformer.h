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
//   or layers.{i}.mlp.{gate,up,down}.weight (SwiGLU); a mixture-of-experts
//   layer (spec.moe_layer(i)) has layers.{i}.moe.{router,experts}.* (moe/layer.h)
//   and its shared experts as layers.{i}.moe.shared.{fc1,fc2 | gate,up,down};
//   final_norm.{weight,bias},
//   head.weight [V_pad, h] (untied only). Biases exist when spec.bias is set.
//
// Dropout masks are keyed, not drawn (nn/keyed_dropout.h): each element's keep
// bit is a hash of (seed, optimizer step, layer, site) and its place in the
// unsplit activations — the row in the step's global batch, the position, the
// feature (residual stream) or the head and key (attention probabilities). So
// every tp/sp/pp/dp layout, micro-batching and recomputation drops what one
// process drops, and nothing about dropout needs saving in a checkpoint. The
// trainer names the step (set_dropout_step); whoever runs a micro-batch names
// its first row (set_dropout_rows, from Batch::first_row).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/model/output_adapter.h"
#include "meshtrain/model/profiler.h"
#include "meshtrain/nn/keyed_dropout.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/nn/recompute.h"
#include "meshtrain/parallel/tensor/layers.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain {

class Comm;
class MoeLayer;

struct Block {
  at::Tensor norm1_w, norm1_b, norm2_w, norm2_b;
  ColumnParallelLinear q, k, v;
  RowParallelLinear o;
  ColumnParallelLinear fc1, gate, up;  // fc1 (GELU) or gate and up (SwiGLU)
  RowParallelLinear fc2;               // fc2 (GELU) or down (SwiGLU)
  // A mixture-of-experts layer (moe/layer.h): its routed experts, and the
  // linears above hold its shared experts (`moe.shared.*`) or none.
  std::shared_ptr<MoeLayer> moe;
  bool dense_ffn = true;  // the linears above exist (a dense layer, or shared experts)
  // Bottleneck adapters (peft/adapter.h) on the attention and MLP outputs, when added.
  std::shared_ptr<OutputAdapter> adapter_attn, adapter_mlp;
};

// Keys and values of the positions seen so far, for generation one token at a
// time: per layer a buffer [b, kv heads/tp, capacity, head_dim] allocated at
// the first step, of which positions [0, length) are filled; each step writes
// its keys and values in place (no copy of the past), and attention reads the
// filled prefix as a view.
struct KVCache {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;
  int64_t capacity = 0;  // positions to allocate (0: the model's sequence)
};

// The part of the model a pipeline stage holds: layers [first, last) (global
// indices, so names and initial weights equal the whole model's), the
// embedding (first stage) and the final norm + head (last stage; with tied
// embeddings it holds its own copy of embed.weight).
struct StagePart {
  int64_t first = 0, last = -1;  // -1: through the last layer
  bool embedding = true, head = true;
};

// Calls around the parts of the model that ZeRO-3 gathers and frees
// (parallel/data/zero.h): unit 0 is the embedding (and learned positions),
// unit i + 1 is layer i, unit L + 1 (head_unit) the final norm and the head
// (the loss, or the logits, or the normed hidden states). before_unit(u) runs
// before the unit's forward; after_unit(u, out) after it, on its output, and
// returns the tensor to continue with. A tied model's head reads unit 0's
// weight: the hooks decide what that means for them.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_unit(int64_t unit) = 0;
  virtual at::Tensor after_unit(int64_t unit, const at::Tensor& out) = 0;
};

// The head's unit number for a model of `layers` layers (UnitHooks).
inline int64_t head_unit(int64_t layers) { return layers + 1; }

class Transformer {
 public:
  // Throws std::invalid_argument when the spec does not divide by tp (heads, kv
  // heads, ffn; the sequence with sequence parallelism).
  // `ep`: the expert-parallel group MoE layers split their experts over (null: none).
  Transformer(const plan::ModelSpec& spec, Comm& tp, bool sequence_parallel, uint64_t seed, StagePart part = {},
              Comm* ep = nullptr);

  // A pipeline stage's forward: `x` is tokens [b, s] when the stage has the
  // embedding, else hidden states [s(/tp), b, h]. Returns hidden states, or on
  // the stage with the head, the per-token loss [s, b] of `targets`.
  at::Tensor stage_forward(const at::Tensor& x, const at::Tensor& targets, bool train = true);
  const StagePart& part() const { return part_; }

  // Per-token loss [s, b] (fp32, the same on every tp rank). targets < 0 are ignored.
  // `doc_ids` [b, s] (optional, data/loader.h): packed documents; a token
  // attends only to its own document and positions restart at each document
  // (needs tiled attention; not with context parallelism).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets, bool train = true,
                     const at::Tensor& doc_ids = {});
  // Logits of this rank's vocabulary slice, [s, b, V_pad/tp]; `doc_ids` as in forward.
  at::Tensor logits(const at::Tensor& tokens, bool train = false, const at::Tensor& doc_ids = {});

  // The final norm's output [s, b, h] (whole on every tp rank; needs sequence
  // parallelism off): what a value head reads (rl/critic.h).
  at::Tensor final_hidden(const at::Tensor& tokens, bool train = false);

  // Generation: logits [t, b, V_pad/tp] of `tokens` [b, t], which continue the
  // positions already in `cache` (empty: a prompt); appends their keys and
  // values. No autograd, no dropout; not with sequence parallelism.
  at::Tensor decode(const at::Tensor& tokens, KVCache& cache);

  // One block on hidden states [s(/tp), b, h] (for benchmarks and labs).
  at::Tensor block_forward(int64_t i, const at::Tensor& x, bool train);
  const Block& block(int64_t i) const { return blocks_.at(i); }
  Block& block_mut(int64_t i) { return blocks_.at(i); }  // for adapters (peft/)
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }

  // The optimizer step and the micro-batch's first global row the next forwards key their
  // dropout masks by (see the top of this file).
  void set_dropout_step(int64_t step) { keys_.step = step; }
  void set_dropout_rows(int64_t first_row) { keys_.first_row = first_row; }
  const nn::DropoutKeys& dropout_keys() const { return keys_; }
  // The global positions of a whole (not sequence-parallel-split) local sequence of `local`
  // tokens: 0..local-1, or this cp rank's zig-zag chunks.
  nn::Coords sequence_coords(int64_t local) const;

  // The blocks' linears by name ("layers.3.attn.q", "layers.0.mlp.fc2"), for adapters (peft/lora.h).
  struct Linears {
    std::vector<std::pair<std::string, ColumnParallelLinear*>> column;
    std::vector<std::pair<std::string, RowParallelLinear*>> row;
  };
  Linears linears();

  // Context parallelism (parallel/context/): the tokens passed to forward are
  // this cp rank's zig-zag chunks of the sequence (zigzag.h), positions are
  // global, and attention runs over the whole sequence by `impl`. Throws
  // std::invalid_argument for what the group cannot split (Ulysses: heads per
  // tp rank not divisible by cp) or attention dropout (cp computes without it).
  void set_context_parallel(Comm& cp, plan::CpImpl impl);

  // Activation recomputation in training forward passes (nn/recompute.h).
  void set_recompute(nn::Recompute r) { recompute_ = r; }
  nn::Recompute recompute() const { return recompute_; }

  void set_unit_hooks(UnitHooks* h) { hooks_ = h; }

  // The loss's output layer and cross-entropy fused, a chunk of tokens at a
  // time (parallel/tensor/fused_cross_entropy.h; on by default). Off, or with
  // an adapter or NF4 weight on the head: the head's logits, then
  // parallel/tensor/cross_entropy.h. Equal within fp32 rounding.
  void set_fused_loss(bool on) { fused_loss_ = on; }
  bool fused_loss() const { return fused_loss_; }

  // The block's elementwise operations fused (nn/fused_ops.h; on by default):
  // the norms; the output projections' bias, residual dropout and add with the
  // next norm; the fc1 bias with GELU; SwiGLU. Off: the ATen compositions.
  // Equal within fp32 rounding (the same dropout masks).
  void set_fused_ops(bool on) { fused_ops_ = on; }
  bool fused_ops() const { return fused_ops_; }

  // This rank's (or stage's) MoE layers, in layer order.
  std::vector<MoeLayer*> moe_layers();
  // The weight of each training forward's router losses (moe/layer.h): 1 /
  // (micro-batches x data-parallel replicas), times the loss scale; set by the step.
  void set_moe_loss_weight(double w) { moe_loss_weight_ = w; }

  // When set, forward records per-segment times (and backward, via markers).
  void set_profiler(SegmentProfiler* p) { profiler_ = p; }

  // After backward: sums the gradients sequence parallelism left partial
  // (norm weights, row-parallel biases, positions) over the tp group.
  void finalize_grads();

  ParamStore& params() { return store_; }
  const plan::ModelSpec& spec() const { return spec_; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // First vocabulary row of this tp rank's slice (also on a last pipeline stage without the embedding).
  int64_t vocab_start() const { return padded_vocab_ / tp_.size() * tp_.rank(); }
  // The tensor-parallel group (rollouts gather the vocabulary-split logits over it).
  Comm& tp_comm() const { return comm_; }

 private:
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  // `docs`: the batch's document ids [b, s] or undefined (see forward).
  // `deferred_bias` not null: the output projection's bias is not added but returned there
  // (as mlp's; undefined when there is none to defer).
  at::Tensor attention(const Block& blk, const at::Tensor& x, bool train, KVCache* cache, int64_t layer,
                       const at::Tensor& docs, at::Tensor* deferred_bias = nullptr) const;
  at::Tensor run_block(int64_t i, const at::Tensor& x, bool train, KVCache* cache, const at::Tensor& docs = {});
  at::Tensor run_block_fused(const Block& blk, int64_t i, const at::Tensor& x, double p, bool train, KVCache* cache,
                             const at::Tensor& docs);
  at::Tensor mlp(const Block& blk, const at::Tensor& x, bool train, at::Tensor* deferred_bias = nullptr) const;
  // The embedding and the layers: the last layer's output (before the final norm).
  at::Tensor trunk(const at::Tensor& tokens, bool train, KVCache* cache = nullptr, const at::Tensor& docs = {});
  // The head unit on the last layer's output `x`: the final norm, then `f` on its output (the head, the
  // loss, or nothing), between the unit hooks of head_unit.
  at::Tensor through_head(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f);
  at::Tensor embed_tokens(const at::Tensor& tokens, bool train, KVCache* cache, const at::Tensor& docs = {});
  at::Tensor run_blocks(at::Tensor x, bool train, KVCache* cache, const at::Tensor& docs = {});
  at::Tensor head(const at::Tensor& h);
  // Per-token loss [s, b] of the final norm's output `h` [s(/tp), b, h] against targets [b, s].
  at::Tensor head_loss(const at::Tensor& h, const at::Tensor& targets);
  // Global positions of `local` tokens on this rank (cp), after `past` cached
  // ones: [local]; with documents, [b, local], restarting at each document.
  at::Tensor positions(int64_t local, int64_t past, const at::Tensor& docs = {}) const;
  int cp_size() const;

  plan::ModelSpec spec_;
  StagePart part_;
  Comm& comm_;
  TensorParallel tp_;
  Comm* cp_ = nullptr;
  plan::CpImpl cp_impl_ = plan::CpImpl::Ring;
  ParamStore store_;
  int64_t padded_vocab_;
  VocabParallelEmbedding embed_;
  at::Tensor pos_;
  std::vector<Block> blocks_;
  at::Tensor final_w_, final_b_;
  ColumnParallelLinear head_;
  SegmentProfiler* profiler_ = nullptr;
  UnitHooks* hooks_ = nullptr;
  void unit_begin(int64_t unit) {
    if (hooks_) hooks_->before_unit(unit);
  }
  at::Tensor unit_end(int64_t unit, const at::Tensor& out) { return hooks_ ? hooks_->after_unit(unit, out) : out; }
  nn::DropoutKeys keys_;
  // The residual stream's dropout over x [s(/tp), b, h] at (layer, site).
  at::Tensor residual_dropout(const at::Tensor& x, double p, int64_t layer, uint64_t site) const;
  // Its keep mask alone, for the fused path (x's dtype).
  at::Tensor residual_keep(const at::Tensor& x, double p, int64_t layer, uint64_t site) const;
  nn::Recompute recompute_ = nn::Recompute::None;
  bool fused_loss_ = true;
  bool fused_ops_ = true;
  // While a loss forward runs through the fused loss with the head tied to the
  // embedding on this rank: where the lookup's rows meet the loss's dW (tied_grad.h).
  const TiedGrad* tied_grad_ = nullptr;
  // forward()/stage_forward(): whether this forward's embedding may be sparse.
  bool tied_loss_forward() const { return fused_loss_ && spec_.tied && part_.embedding && part_.head; }
  double moe_loss_weight_ = 1;
};

}  // namespace meshtrain
