// A transformer block of model/transformer.h: its norms, attention (tensor,
// sequence and context parallel; naive, tiled or SDPA), MLP or MoE layer, the
// residual stream's dropout, and the fused residual-step kernels.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/moe/layer.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/nn/fused_ops.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/nn/tiled_attention.h"
#include "meshtrain/parallel/context/attention.h"
#include "meshtrain/parallel/context/zigzag.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/platform/fault.h"
#include "model/dropout_sites.h"

namespace meshtrain {

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

}  // namespace meshtrain
