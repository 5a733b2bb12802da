#include "meshtrain/model/transformer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "meshtrain/comm/comm.h"
#include "meshtrain/moe/layer.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/nn/fused_ops.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/tiled_attention.h"
#include "meshtrain/parallel/context/attention.h"
#include "meshtrain/parallel/context/zigzag.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/platform/fault.h"
#include "meshtrain/parallel/tensor/cross_entropy.h"
#include "meshtrain/parallel/tensor/fused_cross_entropy.h"
#include "meshtrain/parallel/tensor/tied_grad.h"
#include "model/dropout_sites.h"

namespace meshtrain {
namespace {

void check_divisible(const plan::ModelSpec& m, int tp) {
  auto need = [&](const char* what, int64_t v) {
    if (v % tp != 0) {
      throw std::invalid_argument(fmt::format("model '{}': {} ({}) is not divisible by tp {}; choose tp among the "
                                              "common divisors of heads, kv heads and ffn",
                                              m.name, what, v, tp));
    }
  };
  need("heads", m.heads);
  need("kv heads", m.kv_heads);
  need("ffn", m.ffn);
  if (m.moe()) need("the shared experts' width (shared_experts x expert_ffn)", m.shared_experts * m.expert_width());
}

// Where layer i's dense FFN linears are named: "layers.i.mlp." (a dense
// layer) or "layers.i.moe.shared." (a MoE layer's shared experts).
std::string ffn_prefix(const plan::ModelSpec& m, int64_t i) {
  return fmt::format("layers.{}.{}", i, m.moe_layer(i) ? "moe.shared." : "mlp.");
}

// Sets the model's dropout keys for one scope (recomputation replays a forward under the keys it ran with).
struct ScopedKeys {
  nn::DropoutKeys& keys;
  nn::DropoutKeys was;
  ScopedKeys(nn::DropoutKeys& k, const nn::DropoutKeys& value) : keys(k), was(k) { k = value; }
  ~ScopedKeys() { keys = was; }
};

}  // namespace

Transformer::Transformer(const plan::ModelSpec& spec, Comm& tp, bool sequence_parallel, uint64_t seed, StagePart part,
                         Comm* ep)
    : spec_(spec),
      part_(part),
      comm_(tp),
      tp_{&tp, sequence_parallel && tp.size() > 1},
      store_(seed, tp.rank(), tp.size()),
      padded_vocab_(plan::padded_vocab(spec.vocab, 128LL * tp.size())) {
  plan::validate(spec_);
  check_divisible(spec_, tp.size());
  const int64_t h = spec_.hidden, d = spec_.head_dim(), L = spec_.layers;
  const double std = spec_.init_std, out_std = spec_.init_std / std::sqrt(2.0 * L);  // GPT-2's residual scaling
  const bool ln = spec_.norm == plan::Norm::LayerNorm;
  const bool sp = tp_.sequence_parallel;
  auto norm_params = [&](const std::string& name, at::Tensor& w, at::Tensor& b) {
    w = store_.create(name + ".weight", {h}, Init::Ones, 0, -1, sp);
    if (ln) b = store_.create(name + ".bias", {h}, Init::Zeros, 0, -1, sp);
  };
  if (part_.last < 0) part_.last = L;
  if (part_.first < 0 || part_.first >= part_.last || part_.last > L) {
    throw std::invalid_argument(fmt::format("stage layers [{}, {}) outside the model's {} layers", part_.first,
                                            part_.last, L));
  }
  if (part_.embedding || (part_.head && spec_.tied)) {
    embed_ = VocabParallelEmbedding(store_, "embed", spec_.vocab, padded_vocab_, h, std, tp_);
    // The last pipeline stage's copy of a tied embedding: the first stage owns it.
    store_.params().back().replica = !part_.embedding;
  }
  if (part_.embedding && spec_.position == plan::Position::Learned) {
    pos_ = store_.create("pos.weight", {spec_.seq, h}, Init::Normal, std, -1, sp);
  }
  for (int64_t i = part_.first; i < part_.last; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    Block blk;
    norm_params(p + "norm1", blk.norm1_w, blk.norm1_b);
    blk.q = ColumnParallelLinear(store_, p + "attn.q", h, spec_.heads * d, spec_.bias, std, tp_);
    blk.k = ColumnParallelLinear(store_, p + "attn.k", h, spec_.kv_heads * d, spec_.bias, std, tp_);
    blk.v = ColumnParallelLinear(store_, p + "attn.v", h, spec_.kv_heads * d, spec_.bias, std, tp_);
    blk.o = RowParallelLinear(store_, p + "attn.o", spec_.heads * d, h, spec_.bias, out_std, tp_);
    norm_params(p + "norm2", blk.norm2_w, blk.norm2_b);
    const std::string ffn = ffn_prefix(spec_, i);
    const int64_t width = spec_.moe_layer(i) ? spec_.shared_experts * spec_.expert_width() : spec_.ffn;
    if (spec_.moe_layer(i)) blk.moe = std::make_shared<MoeLayer>(store_, p + "moe", spec_, ep, sp ? &comm_ : nullptr, spec_.moe_layers_before(i));
    blk.dense_ffn = width > 0;
    if (!blk.dense_ffn) {
    } else if (spec_.activation == plan::Activation::SwiGLU) {
      blk.gate = ColumnParallelLinear(store_, ffn + "gate", h, width, spec_.bias, std, tp_);
      blk.up = ColumnParallelLinear(store_, ffn + "up", h, width, spec_.bias, std, tp_);
      blk.fc2 = RowParallelLinear(store_, ffn + "down", width, h, spec_.bias, out_std, tp_);
    } else {
      blk.fc1 = ColumnParallelLinear(store_, ffn + "fc1", h, width, spec_.bias, std, tp_);
      blk.fc2 = RowParallelLinear(store_, ffn + "fc2", width, h, spec_.bias, out_std, tp_);
    }
    blocks_.push_back(std::move(blk));
  }
  if (part_.head) {
    norm_params("final_norm", final_w_, final_b_);
    if (!spec_.tied) head_ = ColumnParallelLinear(store_, "head", h, padded_vocab_, false, std, tp_);
  }
  keys_.seed = seed;
}

Transformer::Linears Transformer::linears() {
  Linears out;
  for (size_t j = 0; j < blocks_.size(); ++j) {
    Block& b = blocks_[j];
    const std::string p = fmt::format("layers.{}.", part_.first + static_cast<int64_t>(j));
    out.column.emplace_back(p + "attn.q", &b.q);
    out.column.emplace_back(p + "attn.k", &b.k);
    out.column.emplace_back(p + "attn.v", &b.v);
    out.row.emplace_back(p + "attn.o", &b.o);
    const std::string ffn = ffn_prefix(spec_, part_.first + static_cast<int64_t>(j));
    if (!b.dense_ffn) {
    } else if (spec_.activation == plan::Activation::SwiGLU) {
      out.column.emplace_back(ffn + "gate", &b.gate);
      out.column.emplace_back(ffn + "up", &b.up);
      out.row.emplace_back(ffn + "down", &b.fc2);
    } else {
      out.column.emplace_back(ffn + "fc1", &b.fc1);
      out.row.emplace_back(ffn + "fc2", &b.fc2);
    }
  }
  return out;
}

void Transformer::set_context_parallel(Comm& cp, plan::CpImpl impl) {
  if (cp.size() > 1 && spec_.dropout > 0) {
    throw std::invalid_argument(fmt::format("context parallelism (cp {}) computes attention without dropout; set "
                                            "model.dropout = 0 (it is {})",
                                            cp.size(), spec_.dropout));
  }
  if (cp.size() > 1 && impl == plan::CpImpl::Ulysses && (spec_.heads / tp_.size()) % cp.size() != 0) {
    throw std::invalid_argument(fmt::format("cp_impl = ulysses: {} heads per tp rank are not divisible by cp {}; use "
                                            "ring or allgather",
                                            spec_.heads / tp_.size(), cp.size()));
  }
  cp_ = &cp;
  cp_impl_ = impl;
}

int Transformer::cp_size() const { return cp_ ? cp_->size() : 1; }

at::Tensor Transformer::positions(int64_t local, int64_t past, const at::Tensor& docs) const {
  if (docs.defined()) {
    // position = index - index of the document's first token (a running max of document starts)
    const at::Tensor idx = at::arange(local, docs.options().dtype(at::kLong)).expand({docs.size(0), local});
    at::Tensor starts = docs.ne(docs.roll(1, 1));
    starts.select(1, 0).fill_(true);
    return idx - std::get<0>((idx * starts).cummax(1));
  }
  if (cp_size() > 1) return ZigZag(local * cp_size(), cp_size(), cp_->rank()).positions().to(compute_device());
  return at::arange(past, past + local, at::TensorOptions().dtype(at::kLong).device(compute_device()));
}

std::vector<MoeLayer*> Transformer::moe_layers() {
  std::vector<MoeLayer*> out;
  for (auto& b : blocks_) {
    if (b.moe) out.push_back(b.moe.get());
  }
  return out;
}

at::Tensor Transformer::trunk(const at::Tensor& tokens, bool train, KVCache* cache, const at::Tensor& docs) {
  if (!part_.embedding || !part_.head) throw std::logic_error("a pipeline stage runs stage_forward, not the whole model");
  if (docs.defined()) {
    if (spec_.attention == plan::AttentionImpl::Naive || spec_.attention == plan::AttentionImpl::Sdpa || cp_size() > 1 ||
        cache) {
      throw std::invalid_argument("document masks need model.attention = \"tiled\" or \"auto\", cp = 1 and no KV cache");
    }
    if (docs.sizes() != tokens.sizes()) throw std::invalid_argument("doc_ids must have the shape of tokens");
  }
  return run_blocks(embed_tokens(tokens, train, cache, docs), train, cache, docs);
}

at::Tensor Transformer::through_head(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f) {
  const int64_t unit = head_unit(spec_.layers);
  unit_begin(unit);
  at::Tensor h;
  {
    std::optional<SegmentProfiler::Scope> rest;
    if (profiler_) rest.emplace(SegmentProfiler::Scope{profiler_, "forward rest"});
    h = norm(x, final_w_, final_b_);
  }
  return unit_end(unit, f(h));
}

at::Tensor Transformer::embed_tokens(const at::Tensor& tokens, bool train, KVCache* cache, const at::Tensor& docs) {
  if (tokens.dim() != 2) throw std::invalid_argument("tokens must be [batch, seq]");
  const int64_t past = cache ? cache->length : 0;
  const int64_t s = tokens.size(1);
  if (past + s * cp_size() > spec_.seq) {
    throw std::invalid_argument(
        fmt::format("sequence {} is longer than the model's maximum {}", past + s * cp_size(), spec_.seq));
  }
  if (tp_.sequence_parallel && s % tp_.size() != 0) {
    throw std::invalid_argument(
        fmt::format("sequence parallelism splits the sequence: {} is not divisible by tp {}", s, tp_.size()));
  }
  unit_begin(0);
  std::optional<SegmentProfiler::Scope> rest;
  if (profiler_) rest.emplace(SegmentProfiler::Scope{profiler_, "forward rest"});
  at::Tensor x = embed_.forward(tokens, tied_grad_);  // [s(/tp), b, h]
  if (pos_.defined()) {
    const int64_t rows = x.size(0), first = tp_.sequence_parallel ? tp_.rank() * rows : 0;
    if (docs.defined()) {  // [b, s] positions -> [rows, b, h]
      const at::Tensor pos = positions(s, past, docs).narrow(1, first, rows);
      x = x + pos_.index_select(0, pos.reshape({-1})).view({pos.size(0), rows, -1}).transpose(0, 1);
    } else if (cp_size() > 1) {
      x = x + pos_.index_select(0, positions(s, past).narrow(0, first, rows)).unsqueeze(1);
    } else {
      x = x + pos_.narrow(0, past + first, rows).unsqueeze(1);
    }
  }
  if (train && spec_.dropout > 0) x = residual_dropout(x, spec_.dropout, -1, kEmbedding);
  return unit_end(0, x);
}

at::Tensor Transformer::run_blocks(at::Tensor x, bool train, KVCache* cache, const at::Tensor& docs) {
  const int64_t s = x.size(0) * (tp_.sequence_parallel ? tp_.size() : 1);
  for (int64_t i = 0; i < static_cast<int64_t>(blocks_.size()); ++i) {
    const int64_t unit = part_.first + i + 1;
    unit_begin(unit);
    if (recompute_ == nn::Recompute::Full && train && !cache) {
      auto blk = [this, i, docs, keys = keys_](const std::vector<at::Tensor>& in) {
        ScopedKeys scoped(keys_, keys);  // the backward's re-run drops what the forward dropped
        return std::vector<at::Tensor>{run_block(i, in[0], true, nullptr, docs)};
      };
      x = nn::checkpoint(blk, {x}, {})[0];
    } else {
      x = run_block(i, x, train, cache, docs);
    }
    if (train && fault_nan_in_layer(unit - 1)) {  // a test's injected fault (platform/fault.h)
      at::Tensor poison = at::zeros_like(x);
      poison.view({-1}).select(0, 0).fill_(std::numeric_limits<double>::quiet_NaN());
      x = x + poison;
    }
    x = unit_end(unit, x);
  }
  if (cache) cache->length += s;
  return x;
}

namespace {

// Sets a value for one scope.
template <class T>
struct Scoped {
  T& value;
  T was;
  Scoped(T& v, T now) : value(v), was(v) { v = now; }
  ~Scoped() { value = was; }
};

}  // namespace

at::Tensor Transformer::stage_forward(const at::Tensor& x, const at::Tensor& targets, bool train) {
  const std::optional<TiedGrad> tied = tied_loss_forward() ? std::optional<TiedGrad>(embed_.weight) : std::nullopt;
  Scoped<const TiedGrad*> slot(tied_grad_, tied ? &*tied : nullptr);
  at::Tensor h = part_.embedding ? embed_tokens(x, train, nullptr) : x;
  h = run_blocks(h, train, nullptr);
  if (!part_.head) return h;
  if (targets.dim() != 2) throw std::invalid_argument("targets must be [batch, seq]");
  return through_head(h, [&](const at::Tensor& n) { return head_loss(n, targets); });
}

at::Tensor Transformer::block_forward(int64_t i, const at::Tensor& input, bool train) {
  return run_block(i, input, train, nullptr);
}

at::Tensor Transformer::head(const at::Tensor& h) {
  std::optional<SegmentProfiler::Scope> t;
  if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward rest"});
  at::Tensor x = tp_.enter(h);
  return spec_.tied ? nn::linear(x, embed_.weight) : head_.forward_entered(x);
}

at::Tensor Transformer::head_loss(const at::Tensor& h, const at::Tensor& targets) {
  const bool plain_head = spec_.tied || (!head_.delta && !head_.packed && !head_.bias.defined());
  if (!fused_loss_ || !plain_head) {
    at::Tensor l = head(h);
    std::optional<SegmentProfiler::Scope> t;
    if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward rest"});
    return vocab_parallel_cross_entropy(l, targets.t(), comm_, vocab_start(), spec_.vocab);
  }
  std::optional<SegmentProfiler::Scope> t;
  if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward rest"});
  const at::Tensor x = tp_.enter(h);  // [s, b, h]
  const at::Tensor& w = spec_.tied ? embed_.weight : head_.weight;
  const at::Tensor loss = fused_linear_cross_entropy(x.reshape({-1, x.size(-1)}), w, targets.t().reshape({-1}), comm_,
                                                     vocab_start(), spec_.vocab, 0, tied_grad_);
  return loss.view({x.size(0), x.size(1)});
}

at::Tensor Transformer::logits(const at::Tensor& tokens, bool train, const at::Tensor& doc_ids) {
  return through_head(trunk(tokens, train, nullptr, doc_ids), [&](const at::Tensor& n) { return head(n); });
}

at::Tensor Transformer::final_hidden(const at::Tensor& tokens, bool train) {
  if (tp_.sequence_parallel) throw std::invalid_argument("a value head needs sequence parallelism off");
  return through_head(trunk(tokens, train), [](const at::Tensor& n) { return n; });
}

at::Tensor Transformer::decode(const at::Tensor& tokens, KVCache& cache) {
  if (tp_.sequence_parallel) throw std::invalid_argument("decoding with a KV cache needs sequence parallelism off");
  if (cp_size() > 1) throw std::invalid_argument("decoding with a KV cache needs context parallelism off (cp = 1)");
  at::NoGradGuard no_grad;
  if (cache.k.empty()) {
    cache.k.resize(blocks_.size());
    cache.v.resize(blocks_.size());
  }
  return through_head(trunk(tokens, false, &cache), [&](const at::Tensor& n) { return head(n); });
}

at::Tensor Transformer::forward(const at::Tensor& tokens, const at::Tensor& targets, bool train,
                                const at::Tensor& doc_ids) {
  if (targets.sizes() != tokens.sizes()) throw std::invalid_argument("targets must have the shape of tokens");
  const std::optional<TiedGrad> tied = tied_loss_forward() ? std::optional<TiedGrad>(embed_.weight) : std::nullopt;
  Scoped<const TiedGrad*> slot(tied_grad_, tied ? &*tied : nullptr);
  return through_head(trunk(tokens, train, nullptr, doc_ids),
                      [&](const at::Tensor& n) { return head_loss(n, targets); });
}

void Transformer::finalize_grads() {
  for (auto& p : store_.params()) {
    if (p.sequence_partial && p.tensor.grad().defined()) comm_.all_reduce(p.tensor.grad());
  }
}

}  // namespace meshtrain
