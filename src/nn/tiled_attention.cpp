#include "meshtrain/nn/tiled_attention.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include "meshtrain/compat.h"
#include "meshtrain/nn/keyed_dropout.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace meshtrain::nn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tile (qt, kt) of row bi, head h: its keep mask [rows, cols] as 0 or 1 / (1 - p).
at::Tensor tile_keep_mask(const TiledAttentionOptions& o, int64_t offset, int64_t bi, int64_t h, int64_t q0,
                          int64_t rows, int64_t k0, int64_t cols) {
  const int64_t row = o.rows.empty() ? bi : o.rows.at(static_cast<size_t>(bi));
  const std::vector<Coords> dims{{row}, {o.head_offset + h}, span(offset + q0, rows), span(k0, cols)};
  return keyed_keep(o.key, o.dropout, dims, at::empty({0}, at::kFloat)).view({rows, cols}).mul_(1.0 / (1.0 - o.dropout));
}

// The problem, in fp32 and contiguous, and its mask, resolved once.
struct Problem {
  at::Tensor q, k, v;  // [b, hq, s, d], [b, hkv, t, d] fp32
  int64_t b = 0, hq = 0, hkv = 0, s = 0, t = 0, d = 0, group = 1, offset = 0;
  bool causal = true;
  int64_t window = 0;
  std::vector<std::vector<int64_t>> docs;  // [b][t], empty: one document
  int64_t bq = 64, bk = 64, nq = 0, nk = 0;
  double scale = 1, dropout = 0;
  TiledAttentionOptions opts;  // the dropout masks' key and coordinates

  Problem(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const AttentionMask& m,
          const TiledAttentionOptions& o) {
    if (q_in.dim() != 4 || k_in.dim() != 4 || v_in.dim() != 4) {
      throw std::invalid_argument("tiled_attention: q, k, v must be [batch, heads, seq, head_dim]");
    }
    b = q_in.size(0), hq = q_in.size(1), s = q_in.size(2), d = q_in.size(3);
    hkv = k_in.size(1), t = k_in.size(2);
    if (k_in.sizes() != v_in.sizes() || k_in.size(0) != b || k_in.size(3) != d || hkv == 0 || hq % hkv != 0) {
      throw std::invalid_argument(fmt::format(
          "tiled_attention: q [{}, {}, {}, {}] does not fit k [{}, {}, {}, {}] / v (heads a multiple of kv heads, same "
          "batch and head_dim)",
          b, hq, s, d, k_in.size(0), hkv, t, k_in.size(3)));
    }
    if (o.block_q < 1 || o.block_k < 1) throw std::invalid_argument("tiled_attention: block sizes must be >= 1");
    if (o.dropout < 0 || o.dropout >= 1) {
      throw std::invalid_argument(fmt::format("tiled_attention: dropout {} must be in [0, 1)", o.dropout));
    }
    dropout = o.dropout;
    opts = o;
    if (!o.rows.empty() && static_cast<int64_t>(o.rows.size()) != b) {
      throw std::invalid_argument(fmt::format("tiled_attention: {} dropout rows for a batch of {}", o.rows.size(), b));
    }
    group = hq / hkv;
    offset = m.q_offset < 0 ? t - s : m.q_offset;
    if (offset + s > t && (m.causal || m.window > 0 || (m.doc_ids.defined() && m.doc_ids.numel() > 0))) {
      throw std::invalid_argument(fmt::format("tiled_attention: queries at {}..{} past the {} keys", offset,
                                              offset + s - 1, t));
    }
    causal = m.causal;
    window = m.window;
    if (m.doc_ids.defined() && m.doc_ids.numel() > 0) {
      if (m.doc_ids.dim() != 2 || m.doc_ids.size(0) != b || m.doc_ids.size(1) != t) {
        throw std::invalid_argument(
            fmt::format("tiled_attention: doc_ids must be [batch, keys] = [{}, {}]", b, t));
      }
      at::Tensor ids = m.doc_ids.to(at::kLong).contiguous();
      for (int64_t i = 0; i < b; ++i) {
        const int64_t* p = ids.data_ptr<int64_t>() + i * t;
        docs.emplace_back(p, p + t);
      }
    }
    q = q_in.to(at::kFloat).contiguous();
    k = k_in.to(at::kFloat).contiguous();
    v = v_in.to(at::kFloat).contiguous();
    bq = o.block_q, bk = o.block_k;
    nq = (s + bq - 1) / bq, nk = (t + bk - 1) / bk;
    scale = 1.0 / std::sqrt(static_cast<double>(d));
  }

  int64_t rows(int64_t qt) const { return std::min(bq, s - qt * bq); }
  int64_t cols(int64_t kt) const { return std::min(bk, t - kt * bk); }

  // How the mask treats tile (qt, kt) of batch bi: hidden entirely, visible entirely, or mixed.
  enum class Tile { Hidden, Visible, Mixed };
  Tile classify(int64_t bi, int64_t qt, int64_t kt) const {
    const int64_t p0 = offset + qt * bq, p1 = p0 + rows(qt) - 1;  // query positions
    const int64_t c0 = kt * bk, c1 = c0 + cols(kt) - 1;            // key positions
    bool mixed = false;
    if (causal) {
      if (c0 > p1) return Tile::Hidden;
      mixed |= c1 > p0;
    }
    if (window > 0) {
      if (c1 <= p0 - window) return Tile::Hidden;
      mixed |= c0 <= p1 - window;
    }
    if (!docs.empty()) {
      const auto& id = docs[bi];
      const auto [qlo, qhi] = std::minmax_element(id.begin() + p0, id.begin() + p1 + 1);
      const auto [klo, khi] = std::minmax_element(id.begin() + c0, id.begin() + c1 + 1);
      if (*qhi < 0 || *khi < 0 || *khi < *qlo || *klo > *qhi) return Tile::Hidden;
      mixed |= *qlo != *qhi || *klo != *khi || *qlo != *klo || *qlo < 0;
    }
    return mixed ? Tile::Mixed : Tile::Visible;
  }

  // [rows, cols] true where query (row) may not see key (col), for a Mixed tile.
  at::Tensor hidden(int64_t bi, int64_t qt, int64_t kt) const {
    auto opt = at::TensorOptions().dtype(at::kLong);
    const at::Tensor pos = at::arange(offset + qt * bq, offset + qt * bq + rows(qt), opt).unsqueeze(1);
    const at::Tensor key = at::arange(kt * bk, kt * bk + cols(kt), opt).unsqueeze(0);
    at::Tensor h = at::zeros({rows(qt), cols(kt)}, opt.dtype(at::kBool));
    if (causal) h = h.logical_or(key > pos);
    if (window > 0) h = h.logical_or(key <= pos - window);
    if (!docs.empty()) {
      const at::Tensor ids = at::from_blob(const_cast<int64_t*>(docs[bi].data()), {t}, opt);
      const at::Tensor dq = ids.narrow(0, offset + qt * bq, rows(qt)).unsqueeze(1);
      const at::Tensor dk = ids.narrow(0, kt * bk, cols(kt)).unsqueeze(0);
      h = h.logical_or(dq != dk).logical_or(dq < 0).logical_or(dk < 0);
    }
    return h;
  }

  at::Tensor q_tile(const at::Tensor& x, int64_t bi, int64_t h, int64_t qt) const {
    return x.select(0, bi).select(0, h).narrow(0, qt * bq, rows(qt));
  }
  at::Tensor k_tile(const at::Tensor& x, int64_t bi, int64_t g, int64_t kt) const {
    return x.select(0, bi).select(0, g).narrow(0, kt * bk, cols(kt));
  }

  // The tile's dropout keep mask, 0 or 1 / (1 - p): [rows, cols].
  at::Tensor keep(int64_t bi, int64_t h, int64_t qt, int64_t kt) const {
    return tile_keep_mask(opts, offset, bi, h, qt * bq, rows(qt), kt * bk, cols(kt));
  }

  // Scores of one tile, masked: [rows, cols].
  at::Tensor scores(int64_t bi, int64_t h, int64_t qt, int64_t kt, Tile kind) const {
    at::Tensor sc = at::mm(q_tile(q, bi, h, qt), k_tile(k, bi, h / group, kt).t()).mul_(scale);
    if (kind == Tile::Mixed) sc.masked_fill_(hidden(bi, qt, kt), -kInf);
    return sc;
  }
};

// Forward: out [b, hq, s, d] fp32, lse [b, hq, s] fp32.
std::tuple<at::Tensor, at::Tensor> forward_pass(const Problem& p) {
  const AutocastOff fp32;  // the tiles compute in fp32 (in-place addmm_ among autocast's casts would mix dtypes)
  at::Tensor out = at::zeros({p.b, p.hq, p.s, p.d}, at::kFloat);
  at::Tensor lse = at::full({p.b, p.hq, p.s}, -kInf, at::kFloat);
  at::parallel_for(0, p.b * p.hq * p.nq, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t qt = w % p.nq, h = (w / p.nq) % p.hq, bi = w / (p.nq * p.hq);
      const int64_t nr = p.rows(qt);
      at::Tensor m = at::full({nr}, -kInf, at::kFloat), l = at::zeros({nr}, at::kFloat);
      at::Tensor o = at::zeros({nr, p.d}, at::kFloat);
      for (int64_t kt = 0; kt < p.nk; ++kt) {
        const Problem::Tile kind = p.classify(bi, qt, kt);
        if (kind == Problem::Tile::Hidden) continue;
        at::Tensor pr = p.scores(bi, h, qt, kt, kind);
        const at::Tensor m_new = at::maximum(m, std::get<0>(pr.max(1)));
        // Rows that have seen no key yet keep m = -inf; shift them by 0 so exp gives 0, not NaN.
        const at::Tensor shift = m_new.masked_fill(m_new == -kInf, 0.0);
        pr.sub_(shift.unsqueeze(1)).exp_();
        const at::Tensor alpha = (m - shift).exp_();
        l.mul_(alpha).add_(pr.sum(1));  // the undropped P normalises
        if (p.dropout > 0) pr.mul_(p.keep(bi, h, qt, kt));
        o.mul_(alpha.unsqueeze(1)).addmm_(pr, p.k_tile(p.v, bi, h / p.group, kt));
        m = m_new;
      }
      const at::Tensor seen = l > 0;
      p.q_tile(out, bi, h, qt).copy_(o / l.masked_fill(seen.logical_not(), 1.0).unsqueeze(1));
      lse.select(0, bi).select(0, h).narrow(0, qt * p.bq, nr).copy_((m + l.log()).masked_fill(seen.logical_not(), -kInf));
    }
  });
  return {out, lse};
}

// Backward: dq, dk, dv in fp32 from dout (fp32) and the saved out, lse. One
// pass over key tiles (FlashAttention-2's loop order): each work item owns its
// key tile's dK, dV (all query heads of its kv group: GQA without repeating
// K/V) and adds its share of dQ into its thread's own copy; the copies are
// summed at the end, so no two threads write one tile and P, dS are computed
// once per tile pair.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_pass(const Problem& p, const at::Tensor& dout,
                                                              const at::Tensor& out, const at::Tensor& lse) {
  const AutocastOff fp32;
  const at::Tensor D = (dout * out).sum(-1);  // [b, hq, s]
  // Rows that saw no key have lse = -inf: P = exp(S - lse) must be 0 there, so shift by +inf.
  const at::Tensor lse_shift = lse.masked_fill(lse == -kInf, kInf);
  at::Tensor dk = at::zeros_like(p.k), dv = at::zeros_like(p.v);
  const int64_t threads = at::get_num_threads();
  at::Tensor dq_parts = at::zeros({threads, p.b, p.hq, p.s, p.d}, at::kFloat);
  auto row_vec = [&](const at::Tensor& x, int64_t bi, int64_t h, int64_t qt) {
    return x.select(0, bi).select(0, h).narrow(0, qt * p.bq, p.rows(qt));
  };
  at::parallel_for(0, p.b * p.hkv * p.nk, 1, [&](int64_t begin, int64_t end) {
    const at::Tensor dq = dq_parts[at::get_thread_num()];
    for (int64_t w = begin; w < end; ++w) {
      const int64_t kt = w % p.nk, g = (w / p.nk) % p.hkv, bi = w / (p.nk * p.hkv);
      at::Tensor dk_acc = p.k_tile(dk, bi, g, kt), dv_acc = p.k_tile(dv, bi, g, kt);
      const at::Tensor k_tile = p.k_tile(p.k, bi, g, kt), v_tile = p.k_tile(p.v, bi, g, kt);
      for (int64_t h = g * p.group; h < (g + 1) * p.group; ++h) {
        for (int64_t qt = 0; qt < p.nq; ++qt) {
          const Problem::Tile kind = p.classify(bi, qt, kt);
          if (kind == Problem::Tile::Hidden) continue;
          const at::Tensor dout_tile = p.q_tile(dout, bi, h, qt);
          at::Tensor pr = p.scores(bi, h, qt, kt, kind);
          pr.sub_(row_vec(lse_shift, bi, h, qt).unsqueeze(1)).exp_();      // P
          at::Tensor ds = at::mm(dout_tile, v_tile.t());                   // dP
          if (p.dropout > 0) {
            const at::Tensor z = p.keep(bi, h, qt, kt);
            ds.mul_(z);                                                    // dP through the dropout
            dv_acc.addmm_((pr * z).t(), dout_tile);                        // dV += (P ∘ Z)ᵀ dO
          } else {
            dv_acc.addmm_(pr.t(), dout_tile);                              // dV += Pᵀ dO
          }
          ds.sub_(row_vec(D, bi, h, qt).unsqueeze(1)).mul_(pr);           // dS = P ∘ (dP - D)
          dk_acc.addmm_(ds.t(), p.q_tile(p.q, bi, h, qt), 1.0, p.scale);  // dK += dSᵀ Q · scale
          p.q_tile(dq, bi, h, qt).addmm_(ds, k_tile, 1.0, p.scale);       // dQ += dS K · scale
        }
      }
    }
  });
  return {dq_parts.sum(0), dk, dv};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TiledAttentionFn : torch::autograd::Function<TiledAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& doc_ids, bool causal, int64_t window, int64_t q_offset, int64_t block_q,
                            int64_t block_k, double dropout, int64_t key, std::vector<int64_t> rows,
                            int64_t head_offset) {
    const Problem p(q, k, v, AttentionMask{causal, window, doc_ids, q_offset},
                    {block_q, block_k, dropout, static_cast<uint64_t>(key), rows, head_offset});
    auto [out, lse] = forward_pass(p);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["doc_ids"] = doc_ids;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["window"] = window;
    ctx->saved_data["q_offset"] = q_offset;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["key"] = key;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["head_offset"] = head_offset;
    return out.to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const AttentionMask m{ctx->saved_data["causal"].toBool(), ctx->saved_data["window"].toInt(),
                          ctx->saved_data["doc_ids"].toTensor(), ctx->saved_data["q_offset"].toInt()};
    const Problem p(q, k, v, m,
                    {ctx->saved_data["block_q"].toInt(), ctx->saved_data["block_k"].toInt(),
                     ctx->saved_data["dropout"].toDouble(), static_cast<uint64_t>(ctx->saved_data["key"].toInt()),
                     ctx->saved_data["rows"].toIntVector(), ctx->saved_data["head_offset"].toInt()});
    auto [dq, dk, dv] = backward_pass(p, grad[0].to(at::kFloat).contiguous(), out, lse);
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(), at::Tensor(),
            at::Tensor(),           at::Tensor(),           at::Tensor(),           at::Tensor(),
            at::Tensor(),           at::Tensor(),           at::Tensor(),           at::Tensor()};
  }
};

}  // namespace

at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask,
                           const TiledAttentionOptions& o) {
  // autograd::Function takes no undefined tensors: no document ids travel as an empty one.
  const at::Tensor docs = mask.doc_ids.defined() ? mask.doc_ids : at::empty({0}, at::kLong);
  return TiledAttentionFn::apply(q, k, v, docs, mask.causal, mask.window, mask.q_offset, o.block_q, o.block_k,
                                 o.dropout, static_cast<int64_t>(o.key), o.rows, o.head_offset);
}

at::Tensor tiled_dropout_mask(int64_t b, int64_t hq, int64_t s, int64_t t, const TiledAttentionOptions& o) {
  at::Tensor z = at::empty({b, hq, s, t}, at::kFloat);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t q0 = 0, qt = 0; q0 < s; q0 += o.block_q, ++qt)
        for (int64_t k0 = 0, kt = 0; k0 < t; k0 += o.block_k, ++kt) {
          const int64_t r = std::min(o.block_q, s - q0), c = std::min(o.block_k, t - k0);
          z[bi][h].narrow(0, q0, r).narrow(1, k0, c).copy_(tile_keep_mask(o, t - s, bi, h, q0, r, k0, c));
        }
  return z;
}

std::tuple<at::Tensor, at::Tensor> tiled_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const AttentionMask& mask,
                                                           const TiledAttentionOptions& o) {
  const Problem p(q.detach(), k.detach(), v.detach(), mask, o);
  auto [out, lse] = forward_pass(p);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tiled_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, const AttentionMask& mask, const TiledAttentionOptions& o) {
  const Problem p(q.detach(), k.detach(), v.detach(), mask, o);
  return backward_pass(p, dout.detach().to(at::kFloat).contiguous(), out.detach().to(at::kFloat).contiguous(),
                       lse.detach().to(at::kFloat).contiguous());
}

}  // namespace meshtrain::nn
