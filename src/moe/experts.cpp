#include "meshtrain/moe/experts.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <vector>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"

namespace meshtrain {
namespace {

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Expert parallelism: rows [n, h] sorted by global expert, counts [E]. The
// counts go first (each rank learns how many rows each peer sends to each of
// its experts), then the rows; they arrive in blocks by source rank, each
// sorted by local expert, and are regrouped by expert for the GEMMs; the
// outputs are put back in arrival order and sent home.
at::Tensor expert_parallel_ffn(const at::Tensor& rows, const at::Tensor& counts, const ExpertWeights& w, Comm& ep,
                               int64_t* remote_rows) {
  const int P = ep.size();
  const int64_t El = w.w1.size(0);
  const at::Tensor mine = counts.view({P, El}).contiguous();  // [to rank, its expert]
  at::Tensor theirs = at::empty_like(mine);                    // [from rank, my expert]
  ep.all_to_all(theirs, mine);
  const std::vector<int64_t> send = to_vector(mine.sum(1)), recv = to_vector(theirs.sum(1));
  if (remote_rows) {
    for (int j = 0; j < P; ++j) *remote_rows += j == ep.rank() ? 0 : send[static_cast<size_t>(j)] + recv[static_cast<size_t>(j)];
  }
  const at::Tensor arrived = all_to_all_rows(rows, ep, send, recv);
  // Block (j, e): rows from rank j for my expert e, at offset start[j][e] of `arrived`.
  const std::vector<int64_t> c = to_vector(theirs);
  std::vector<int64_t> start(c.size());
  int64_t at_row = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    start[i] = at_row;
    at_row += c[i];
  }
  std::vector<int64_t> order;  // arrival index of each row, expert-major
  order.reserve(static_cast<size_t>(at_row));
  std::vector<int64_t> per_expert(static_cast<size_t>(El), 0);
  for (int64_t e = 0; e < El; ++e) {
    for (int j = 0; j < P; ++j) {
      const size_t b = static_cast<size_t>(j) * static_cast<size_t>(El) + static_cast<size_t>(e);
      for (int64_t t = 0; t < c[b]; ++t) order.push_back(start[b] + t);
      per_expert[static_cast<size_t>(e)] += c[b];
    }
  }
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor grouped = arrived.index_select(0, at::tensor(order, opts));
  const at::Tensor out = grouped_ffn(grouped, per_expert, w).index_select(0, at::tensor(inverse, opts));
  return all_to_all_rows(out, ep, recv, send);
}

}  // namespace

at::Tensor expert_ffn(const at::Tensor& x, const ExpertWeights& w, int64_t e) {
  const at::Tensor a = at::matmul(x, w.w1[e].t());
  const at::Tensor h = w.w3.defined() ? at::silu(a) * at::matmul(x, w.w3[e].t()) : at::gelu(a);
  return at::matmul(h, w.w2[e].t());
}

at::Tensor grouped_ffn(const at::Tensor& rows, const std::vector<int64_t>& counts, const ExpertWeights& w) {
  std::vector<at::Tensor> outs;
  int64_t at_row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    outs.push_back(expert_ffn(rows.narrow(0, at_row, counts[e]), w, static_cast<int64_t>(e)));
    at_row += counts[e];
  }
  if (!outs.empty()) return at::cat(outs);
  // No rows: an empty output that still depends on the weights, so that they
  // get a zero gradient (data parallelism expects one from every rank), and on
  // the rows, so that backward still reaches the exchange that brought them
  // (every ep rank must make it, or the ranks' all-to-alls fall out of step).
  at::Tensor touch = w.w1.sum() + w.w2.sum() + rows.sum();
  if (w.w3.defined()) touch = touch + w.w3.sum();
  return at::zeros({0, rows.size(1)}, rows.options()) + (touch * 0).to(rows.scalar_type());
}

at::Tensor run_experts(const at::Tensor& x, const Routing& r, const ExpertWeights& w, Comm* ep, int64_t* remote_rows) {
  const int P = ep ? ep->size() : 1;
  const int64_t T = x.size(0), k = r.expert.size(1), E = w.w1.size(0) * P;
  // The kept assignments, sorted by expert (stable: token order within an expert).
  const at::Tensor kept = r.kept.reshape({-1});
  const at::Tensor expert = r.expert.reshape({-1}).masked_select(kept);
  const at::Tensor token = at::arange(T, at::kLong).repeat_interleave(k).masked_select(kept);
  const at::Tensor gate = r.gate.reshape({-1}).masked_select(kept);
  const at::Tensor order = std::get<1>(expert.sort(c10::optional<bool>(true), 0, false));  // stable
  const at::Tensor rows = token.index_select(0, order);
  const at::Tensor counts = at::bincount(expert, {}, E);
  const at::Tensor xs = x.index_select(0, rows);
  const at::Tensor ys =
      P > 1 ? expert_parallel_ffn(xs, counts, w, *ep, remote_rows) : grouped_ffn(xs, to_vector(counts), w);
  const at::Tensor weighted = ys * gate.index_select(0, order).unsqueeze(1).to(ys.scalar_type());
  return at::zeros_like(x, ys.options()).index_add(0, rows, weighted);
}

}  // namespace meshtrain
