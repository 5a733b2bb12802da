// LLM Lab 05: attention split by heads (Megatron-LM's self-attention).
//
// Heads are independent, so the q, k, v projections are column-parallel: rank r
// computes heads [r*a/t, (r+1)*a/t) (and its share of the kv heads with GQA)
// with no communication. Two ways to finish:
//   (i)  all-gather the heads' outputs and apply the full output projection
//        everywhere: (t-1)/t x s.b.h gathered, the o-projection computed t times;
//   (ii) Megatron: the output projection is row-parallel (its input is already
//        split by heads), one all-reduce of s.b.h: 2(t-1)/t x s.b.h, no
//        duplicated compute, and the next layer gets whole activations.
// Both are checked against one process with the full weights.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "labs/labs.h"
#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/parallel/tensor/layers.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {

int lab05_attention_heads(Runtime& rt) {
  Comm& tp = rt.world();
  const int t = tp.size();
  constexpr int64_t kS = 6, kB = 2, kHeads = 8, kKv = 4, kD = 4, kH = kHeads * kD;
  if (kKv % t != 0) throw std::invalid_argument("lab 05 splits 8 query / 4 kv heads: use 1, 2 or 4 ranks");
  ParamStore store(3, tp.rank(), t), full(3, 0, 1);
  Comm solo("solo", rt.rank());
  TensorParallel par{&tp, false}, one{&solo, false};
  struct Attn {
    ColumnParallelLinear q, k, v;
    RowParallelLinear o;
  };
  auto make = [&](ParamStore& s, TensorParallel p) {
    return Attn{ColumnParallelLinear(s, "q", kH, kHeads * kD, true, 0.2, p),
                ColumnParallelLinear(s, "k", kH, kKv * kD, true, 0.2, p),
                ColumnParallelLinear(s, "v", kH, kKv * kD, true, 0.2, p), RowParallelLinear(s, "o", kH, kH, true, 0.2, p)};
  };
  Attn a = make(store, par), a1 = make(full, one);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  at::Tensor x = at::randn({kS, kB, kH}, gen);
  // Heads of one rank: [s, b, n*d] -> [b, n, s, d], attention, back to [s, b, n*d].
  auto heads_out = [&](const Attn& m, const at::Tensor& in, int64_t hq, int64_t hkv) {
    auto split = [&](const at::Tensor& y, int64_t n) { return y.view({kS, kB, n, kD}).permute({1, 2, 0, 3}); };
    at::Tensor ctx = nn::causal_attention(split(m.q.forward_entered(in), hq), split(m.k.forward_entered(in), hkv),
                                          split(m.v.forward_entered(in), hkv));
    return ctx.permute({2, 0, 1, 3}).reshape({kS, kB, hq * kD});
  };
  const int64_t hq = kHeads / t, hkv = kKv / t;
  fmt::print("rank {}: query heads {}..{}, kv heads {}..{}\n", tp.rank(), tp.rank() * hq, (tp.rank() + 1) * hq - 1,
             tp.rank() * hkv, (tp.rank() + 1) * hkv - 1);
  at::Tensor want = a1.o.forward(heads_out(a1, x, kHeads, kKv));
  int bad = 0;
  const double ring = (t - 1.0) / t, sbh = kS * kB * kH;

  tp.reset_stats();
  at::Tensor local = heads_out(a, x, hq, hkv);
  at::Tensor gathered = gather_along(local, tp, -1);
  at::Tensor y1 = at::linear(gathered, a1.o.weight, a1.o.bias);  // full o-projection on every rank
  const double g_bytes = tp.stats().count("all_gather") ? tp.stats().at("all_gather").wire_bytes / 4.0 : 0;
  tp.reset_stats();
  at::Tensor y2 = a.o.forward(local);
  const double r_bytes = tp.stats().count("all_reduce") ? tp.stats().at("all_reduce").wire_bytes / 4.0 : 0;
  const double e1 = (y1 - want).abs().max().item<double>(), e2 = (y2 - want).abs().max().item<double>();
  bad += e1 > 1e-5 || e2 > 1e-5 || std::abs(g_bytes - ring * sbh) > 0.5 || std::abs(r_bytes - 2 * ring * sbh) > 0.5;
  if (rt.rank() == 0) {
    fmt::print("(i)  gather heads, full o-proj:  error {:.1e}; all-gather {} elements (derived (t-1)/t s.b.h = {:.0f})\n",
               e1, g_bytes, ring * sbh);
    fmt::print("(ii) row-parallel o-proj:       error {:.1e}; all-reduce {} elements (derived 2(t-1)/t s.b.h = {:.0f})\n",
               e2, r_bytes, 2 * ring * sbh);
    fmt::print("(ii) moves {} the bytes of (i) but computes the o-projection once instead of {} times, and in a\n"
               "     training step its backward needs no communication (the all-reduce's adjoint is the identity).\n",
               t > 1 ? "twice" : "the same", t);
  }
  at::Tensor flag = at::tensor({static_cast<int64_t>(bad)}, at::kLong);
  tp.all_reduce(flag);
  return flag.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace meshtrain::labs
