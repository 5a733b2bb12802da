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

// The dropout sites of a layer (nn::DropoutKeys::key's second name).
enum DropoutSite : uint64_t { kEmbedding = 1, kAttentionProbs = 2, kAttentionOut = 3, kMlpOut = 4 };

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

// The residual stream [s(/tp), b, h]: under sequence parallelism this rank holds positions
// tp_rank x s/tp onwards; every feature is whole.
at::Tensor Transformer::residual_keep(const at::Tensor& x, double p, int64_t layer, uint64_t site) const {
  const int64_t rows = x.size(0), split = tp_.sequence_parallel ? tp_.size() : 1;
  const nn::Coords whole = sequence_coords(rows * split);
  const nn::Coords mine(whole.begin() + (split > 1 ? tp_.rank() * rows : 0),
                        whole.begin() + (split > 1 ? tp_.rank() * rows : 0) + rows);
  return nn::keyed_keep(keys_.key(static_cast<uint64_t>(layer), site), p,
                        {mine, keys_.rows(x.size(1)), nn::span(0, x.size(2))}, x);
}

nn::Coords Transformer::sequence_coords(int64_t local) const {
  if (cp_size() <= 1) return nn::span(0, local);
  const at::Tensor pos = ZigZag(local * cp_size(), cp_size(), cp_->rank()).positions().to(at::kLong).contiguous();
  return nn::Coords(pos.data_ptr<int64_t>(), pos.data_ptr<int64_t>() + pos.numel());
}

at::Tensor Transformer::residual_dropout(const at::Tensor& x, double p, int64_t layer, uint64_t site) const {
  if (p <= 0) return x;
  return x * residual_keep(x, p, layer, site) * (1.0 / (1.0 - p));
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

at::Tensor Transformer::norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  if (fused_ops_) return nn::norm(x, {w, b, spec_.norm_eps, spec_.norm == plan::Norm::RMSNorm});
  return spec_.norm == plan::Norm::LayerNorm ? nn::layer_norm(x, w, b, spec_.norm_eps)
                                             : nn::rms_norm(x, w, spec_.norm_eps);
}

at::Tensor Transformer::attention(const Block& blk, const at::Tensor& x, bool train, KVCache* cache, int64_t layer,
                                  const at::Tensor& docs, at::Tensor* deferred_bias) const {
  at::Tensor in = tp_.enter(x);  // [s, b, h]
  const int64_t s = in.size(0), b = in.size(1), d = spec_.head_dim();
  const int64_t hq = spec_.heads / tp_.size(), hkv = spec_.kv_heads / tp_.size();
  // [s, b, heads*d] -> [b, heads, s, d]
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({s, b, n, d}).permute({1, 2, 0, 3}); };
  at::Tensor q = heads(blk.q.forward_entered(in), hq);
  at::Tensor k = heads(blk.k.forward_entered(in), hkv);
  at::Tensor v = heads(blk.v.forward_entered(in), hkv);
  const int64_t past = cache ? cache->length : 0;
  if (spec_.position == plan::Position::RoPE) {
    const at::Tensor pos = positions(s, past, docs);
    q = nn::rope(q, spec_.rope_theta, pos);
    k = nn::rope(k, spec_.rope_theta, pos);
  }
  if (cache) {
    auto& ck = cache->k[layer];
    auto& cv = cache->v[layer];
    const int64_t filled = past + s;
    if (!ck.defined() || ck.size(2) < filled) {
      // One buffer per layer for the whole generation; when the caller's capacity was short, doubled
      // (up to the model's sequence), so that growing copies the past O(log n) times, not per token.
      const int64_t want = ck.defined() ? std::min(spec_.seq, 2 * ck.size(2))
                                        : (cache->capacity > 0 ? cache->capacity : spec_.seq);
      const int64_t cap = std::max(filled, want);
      at::Tensor nk = at::empty({b, hkv, cap, d}, k.options()), nv = at::empty({b, hkv, cap, d}, v.options());
      if (ck.defined()) {
        nk.narrow(2, 0, past).copy_(ck.narrow(2, 0, past));
        nv.narrow(2, 0, past).copy_(cv.narrow(2, 0, past));
      }
      ck = nk;
      cv = nv;
    }
    ck.narrow(2, past, s).copy_(k);
    cv.narrow(2, past, s).copy_(v);
    k = ck.narrow(2, 0, filled);
    v = cv.narrow(2, 0, filled);
  }
  const double p = train ? spec_.dropout : 0.0;
  // Attention dropout over [b, hq, s, t]: the row in the global batch, the global head, the query's and the key's position.
  const uint64_t key = keys_.key(static_cast<uint64_t>(part_.first + layer), kAttentionProbs);
  const nn::Coords rows = keys_.rows(b);
  const int64_t head_offset = tp_.rank() * hq;
  // sdpa is causal from the first key, so a KV cache's later tokens (queries after `past` keys)
  // take another path, as do a chunk's queries that see earlier chunks (context parallelism).
  const bool cuda = q.is_cuda();
  const bool sdpa = past == 0 && plan::attention_sdpa(spec_.attention, p, docs.defined(), cp_size(), cuda);
  const bool tiled = !cuda && plan::attention_tiled(spec_.attention, past + s * cp_size(), docs.defined());
  // The masks' key and coordinates are captured by value: a recomputation replays them.
  auto local = [p, key, rows, head_offset, tiled, sdpa, docs](const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v) {
    if (sdpa && q.size(2) == k.size(2)) return nn::sdpa_causal_attention(q, k, v);
    const int64_t s = q.size(2), t = k.size(2);
    if (!tiled) {
      if (p <= 0) return nn::causal_attention(q, k, v);
      const at::Tensor keep = nn::keyed_keep(
          key, p, {rows, nn::span(head_offset, q.size(1)), nn::span(t - s, s), nn::span(0, t)}, q);
      return nn::causal_attention(q, k, v, p, keep);
    }
    nn::TiledAttentionOptions o;
    o.dropout = p;
    o.key = key;
    o.rows = rows;
    o.head_offset = head_offset;
    nn::AttentionMask mask;
    mask.doc_ids = docs;
    return nn::tiled_attention(q, k, v, mask, o);
  };
  Comm* cp = cp_size() > 1 ? cp_ : nullptr;
  const plan::CpImpl impl = cp_impl_;
  auto core = [local, cp, impl](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{cp ? context_attention(in[0], in[1], in[2], *cp, impl, local)
                                      : local(in[0], in[1], in[2])};
  };
  at::Tensor ctx;  // [b, hq, s, d]
  if (recompute_ == nn::Recompute::Selective && train) {
    ctx = nn::checkpoint(core, {q, k, v}, {})[0];
  } else {
    ctx = core({q, k, v})[0];
  }
  if (deferred_bias) *deferred_bias = blk.o.bias;
  return blk.o.forward(ctx.permute({2, 0, 1, 3}).reshape({s, b, hq * d}), !deferred_bias);
}

at::Tensor Transformer::mlp(const Block& blk, const at::Tensor& x, bool train, at::Tensor* deferred_bias) const {
  at::Tensor out;
  if (blk.dense_ffn) {
    at::Tensor in = tp_.enter(x);
    at::Tensor hidden;
    if (!fused_ops_) {
      hidden = spec_.activation == plan::Activation::SwiGLU
                   ? at::silu(blk.gate.forward_entered(in)) * blk.up.forward_entered(in)
                   : at::gelu(blk.fc1.forward_entered(in), "tanh");
    } else if (spec_.activation == plan::Activation::SwiGLU) {
      hidden = nn::swiglu(blk.gate.forward_entered(in), blk.up.forward_entered(in));
    } else {
      hidden = nn::bias_gelu(blk.fc1.forward_entered(in, false), blk.fc1.bias);
    }
    // The bias is deferred only where out is the whole branch (no routed experts added).
    const bool defer = deferred_bias && !blk.moe;
    if (defer) *deferred_bias = blk.fc2.bias;
    out = blk.fc2.forward(hidden, !defer);
  }
  if (!blk.moe) return out;
  // The routed experts see the rows this rank holds (its sequence shard with sequence parallelism).
  at::Tensor routed = blk.moe->forward(x, train ? moe_loss_weight_ : 0.0);
  return out.defined() ? out + routed : routed;
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
  at::Tensor x = embed_.forward(tokens, sparse_embedding_grad_);  // [s(/tp), b, h]
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

// Sets a flag for one scope.
struct ScopedFlag {
  bool& flag;
  bool was;
  ScopedFlag(bool& f, bool value) : flag(f), was(f) { f = value; }
  ~ScopedFlag() { flag = was; }
};

}  // namespace

at::Tensor Transformer::stage_forward(const at::Tensor& x, const at::Tensor& targets, bool train) {
  ScopedFlag sparse(sparse_embedding_grad_, tied_loss_forward());
  at::Tensor h = part_.embedding ? embed_tokens(x, train, nullptr) : x;
  h = run_blocks(h, train, nullptr);
  if (!part_.head) return h;
  if (targets.dim() != 2) throw std::invalid_argument("targets must be [batch, seq]");
  return through_head(h, [&](const at::Tensor& n) { return head_loss(n, targets); });
}

at::Tensor Transformer::block_forward(int64_t i, const at::Tensor& input, bool train) {
  return run_block(i, input, train, nullptr);
}

at::Tensor Transformer::run_block(int64_t i, const at::Tensor& input, bool train, KVCache* cache,
                                  const at::Tensor& docs) {
  const Block& blk = blocks_.at(i);
  const double p = train ? spec_.dropout : 0.0;
  at::Tensor x = profiler_ ? profiler_->mark(input, static_cast<int>(i), false) : input;
  if (fused_ops_) return run_block_fused(blk, i, x, p, train, cache, docs);
  {
    std::optional<SegmentProfiler::Scope> t;
    if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward attention"});
    at::Tensor a = attention(blk, norm(x, blk.norm1_w, blk.norm1_b), train, cache, i, docs);
    if (blk.adapter_attn) a = blk.adapter_attn->forward(a);
    x = x + residual_dropout(a, p, part_.first + i, kAttentionOut);
  }
  {
    std::optional<SegmentProfiler::Scope> t;
    if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward ffn"});
    at::Tensor m = mlp(blk, norm(x, blk.norm2_w, blk.norm2_b), train);
    if (blk.adapter_mlp) m = blk.adapter_mlp->forward(m);
    x = x + residual_dropout(m, p, part_.first + i, kMlpOut);
  }
  return profiler_ ? profiler_->mark(x, static_cast<int>(i), true) : x;
}

// run_block with nn/fused_ops.h: each branch's output bias, dropout and residual add are one
// pass with the next norm (the same keyed masks as run_block's).
at::Tensor Transformer::run_block_fused(const Block& blk, int64_t i, const at::Tensor& x, double p, bool train,
                                        KVCache* cache, const at::Tensor& docs) {
  const nn::NormWeights norm2{blk.norm2_w, blk.norm2_b, spec_.norm_eps, spec_.norm == plan::Norm::RMSNorm};
  auto join = [&](const at::Tensor& branch, const at::Tensor& bias, uint64_t site) {
    return nn::BranchJoin{bias, p > 0 ? residual_keep(branch, p, part_.first + i, site) : at::Tensor(), p};
  };
  at::Tensor mid, normed;
  {
    std::optional<SegmentProfiler::Scope> t;
    if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward attention"});
    at::Tensor bias;
    at::Tensor a = attention(blk, norm(x, blk.norm1_w, blk.norm1_b), train, cache, i, docs,
                             blk.adapter_attn ? nullptr : &bias);
    if (blk.adapter_attn) a = blk.adapter_attn->forward(a);
    std::tie(mid, normed) = nn::add_norm(x, a, join(a, bias, kAttentionOut), norm2);
  }
  std::optional<SegmentProfiler::Scope> t;
  if (profiler_) t.emplace(SegmentProfiler::Scope{profiler_, "forward ffn"});
  at::Tensor bias;
  at::Tensor m = mlp(blk, normed, train, blk.adapter_mlp ? nullptr : &bias);
  if (blk.adapter_mlp) m = blk.adapter_mlp->forward(m);
  at::Tensor out = nn::add_norm(mid, m, join(m, bias, kMlpOut), {}).first;
  return profiler_ ? profiler_->mark(out, static_cast<int>(i), true) : out;
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
                                                     vocab_start(), spec_.vocab);
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
  ScopedFlag sparse(sparse_embedding_grad_, tied_loss_forward());
  return through_head(trunk(tokens, train, nullptr, doc_ids),
                      [&](const at::Tensor& n) { return head_loss(n, targets); });
}

void Transformer::finalize_grads() {
  for (auto& p : store_.params()) {
    if (p.sequence_partial && p.tensor.grad().defined()) comm_.all_reduce(p.tensor.grad());
  }
}

}  // namespace meshtrain
