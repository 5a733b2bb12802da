#include "meshtrain/parallel/context/ring_attention.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/context/zigzag.h"

namespace meshtrain {
namespace {

constexpr int kTagKV = 11, kTagGrad = 12;
constexpr double kInf = std::numeric_limits<double>::infinity();

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A chunk pair of one step: local query chunk qi (0, 1) on key chunk ki of
// the block in hand; causal when they are the same chunk.
struct ChunkPair {
  int64_t qi, ki;
  bool causal;
};

std::vector<ChunkPair> visible_pairs(const ZigZag& z, int me, int owner) {
  const auto [qa, qb] = z.chunks_of(me);
  const auto [ka, kb] = z.chunks_of(owner);
  std::vector<ChunkPair> out;
  const int64_t qs[2] = {qa, qb}, ks[2] = {ka, kb};
  for (int64_t qi = 0; qi < 2; ++qi) {
    for (int64_t ki = 0; ki < 2; ++ki) {
      if (ks[ki] <= qs[qi]) out.push_back({qi, ki, ks[ki] == qs[qi]});
    }
  }
  return out;
}

// Merges a partial result (o, l) into (out, lse) in place, by log-sum-exp.
void merge(at::Tensor out, at::Tensor lse, const at::Tensor& o, const at::Tensor& l) {
  const at::Tensor m = at::maximum(lse, l);
  const at::Tensor shift = m.masked_fill(m == -kInf, 0.0);  // rows no key has reached: weights 0, not NaN
  const at::Tensor wa = (lse - shift).exp(), wb = (l - shift).exp(), sum = wa + wb;
  const at::Tensor denom = sum.masked_fill(sum == 0, 1.0);
  out.copy_((out * wa.unsqueeze(-1) + o * wb.unsqueeze(-1)) / denom.unsqueeze(-1));
  lse.copy_((shift + sum.log()).masked_fill(sum == 0, -kInf));
}

// The K/V block (or its gradient) in flight to the next rank and from the previous one.
struct Hop {
  CommWork send, recv;
  at::Tensor incoming;
  void start(Comm& cp, const at::Tensor& outgoing, int tag) {
    const int n = cp.size(), r = cp.rank();
    incoming = at::empty_like(outgoing);
    send = cp.isend(outgoing, (r + 1) % n, tag);
    recv = cp.irecv(incoming, (r - 1 + n) % n, tag);
  }
  at::Tensor finish() {
    const auto t0 = Clock::now();
    recv.wait();
    send.wait();
    ring_stats().wait_s += since(t0);
    ring_stats().hops += 1;
    return incoming;
  }
};

// Local chunk i (0, 1) of c tokens along the sequence dim.
at::Tensor rows_of(const at::Tensor& x, int64_t i, int64_t c) { return x.narrow(2, i * c, c); }

nn::AttentionMask causal_mask(bool causal) {
  nn::AttentionMask m;
  m.causal = causal;
  return m;
}

struct RingAttentionFn : torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, Comm* cp, int64_t block_q, int64_t block_k) {
    const auto t0 = Clock::now();
    const int n = cp->size(), me = cp->rank();
    const ZigZag z(q.size(2) * n, n, me);
    const int64_t c = z.chunk();
    nn::TiledAttentionOptions o;  // no dropout: cp refuses it (model/transformer.h)
    o.block_q = block_q;
    o.block_k = block_k;
    const at::Tensor qf = q.to(at::kFloat);
    at::Tensor out = at::zeros(qf.sizes(), at::kFloat);
    at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, -kInf, at::kFloat);
    at::Tensor kv = at::stack({k, v}).contiguous();  // travels in the inputs' dtype
    for (int i = 0; i < n; ++i) {
      Hop hop;
      if (i + 1 < n) hop.start(*cp, kv, kTagKV);
      const at::Tensor kvf = kv.to(at::kFloat);
      for (const ChunkPair& p : visible_pairs(z, me, (me - i + n) % n)) {
        auto [po, pl] = nn::tiled_attention_forward(rows_of(qf, p.qi, c), rows_of(kvf[0], p.ki, c),
                                                    rows_of(kvf[1], p.ki, c), causal_mask(p.causal), o);
        merge(rows_of(out, p.qi, c), lse.narrow(2, p.qi * c, c), po, pl);
      }
      if (i + 1 < n) kv = hop.finish();
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["cp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(cp));  // IValue holds no raw pointers
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    ring_stats().total_s += since(t0);
    return out.to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto t0 = Clock::now();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Comm* cp = reinterpret_cast<Comm*>(static_cast<intptr_t>(ctx->saved_data["cp"].toInt()));
    nn::TiledAttentionOptions o;
    o.block_q = ctx->saved_data["block_q"].toInt();
    o.block_k = ctx->saved_data["block_k"].toInt();
    const int n = cp->size(), me = cp->rank();
    const ZigZag z(q.size(2) * n, n, me);
    const int64_t c = z.chunk();
    const at::Tensor qf = q.to(at::kFloat), dout = grad[0].to(at::kFloat);
    at::Tensor dq = at::zeros(qf.sizes(), at::kFloat);
    at::Tensor kv = at::stack({k, v}).contiguous();
    std::optional<Hop> grad_hop;  // the dK/dV accumulator of the previous step's block, in flight
    at::Tensor home;              // this rank's own block's dK/dV, all ranks' shares
    for (int i = 0; i < n; ++i) {
      Hop hop;
      if (i + 1 < n) hop.start(*cp, kv, kTagKV);
      const at::Tensor kvf = kv.to(at::kFloat);
      at::Tensor dkv = at::zeros(kvf.sizes(), at::kFloat);
      for (const ChunkPair& p : visible_pairs(z, me, (me - i + n) % n)) {
        auto [pq, pk, pv] = nn::tiled_attention_backward(
            rows_of(qf, p.qi, c), rows_of(kvf[0], p.ki, c), rows_of(kvf[1], p.ki, c), rows_of(out, p.qi, c),
            lse.narrow(2, p.qi * c, c), rows_of(dout, p.qi, c), causal_mask(p.causal), o);
        rows_of(dq, p.qi, c).add_(pq);
        rows_of(dkv[0], p.ki, c).add_(pk);
        rows_of(dkv[1], p.ki, c).add_(pv);
      }
      // The previous rank's shares of this block arrive one hop behind it.
      if (grad_hop) dkv.add_(grad_hop->finish());
      if (n == 1) {
        home = dkv;
      } else {
        grad_hop.emplace();
        grad_hop->start(*cp, dkv, kTagGrad);
      }
      if (i + 1 < n) kv = hop.finish();
    }
    if (grad_hop) home = grad_hop->finish();  // the last hop brings this rank's block home
    ring_stats().total_s += since(t0);
    return {dq.to(q.scalar_type()), home[0].to(k.scalar_type()), home[1].to(v.scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

RingStats& ring_stats() {
  static RingStats s;
  return s;
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                          const nn::TiledAttentionOptions& o) {
  return RingAttentionFn::apply(q, k, v, &cp, o.block_q, o.block_k);
}

}  // namespace meshtrain
