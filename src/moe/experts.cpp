#include "meshtrain/moe/experts.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <vector>

namespace meshtrain {

at::Tensor expert_ffn(const at::Tensor& x, const ExpertWeights& w, int64_t e) {
  const at::Tensor a = at::matmul(x, w.w1[e].t());
  const at::Tensor h = w.w3.defined() ? at::silu(a) * at::matmul(x, w.w3[e].t()) : at::gelu(a);
  return at::matmul(h, w.w2[e].t());
}

at::Tensor run_experts(const at::Tensor& x, const Routing& r, const ExpertWeights& w) {
  const int64_t T = x.size(0), k = r.expert.size(1), E = w.w1.size(0);
  // The kept assignments, sorted by expert (stable: token order within an expert).
  const at::Tensor kept = r.kept.reshape({-1});
  const at::Tensor expert = r.expert.reshape({-1}).masked_select(kept);
  const at::Tensor token = at::arange(T, at::kLong).repeat_interleave(k).masked_select(kept);
  const at::Tensor gate = r.gate.reshape({-1}).masked_select(kept);
  const at::Tensor order = std::get<1>(expert.sort(c10::optional<bool>(true), 0, false));  // stable
  const at::Tensor rows = token.index_select(0, order);
  const at::Tensor counts = at::bincount(expert, {}, E);
  const at::Tensor xs = x.index_select(0, rows);
  std::vector<at::Tensor> outs;
  int64_t at_row = 0;
  const auto* c = counts.data_ptr<int64_t>();
  for (int64_t e = 0; e < E; ++e) {
    if (c[e] == 0) continue;
    outs.push_back(expert_ffn(xs.narrow(0, at_row, c[e]), w, e));
    at_row += c[e];
  }
  at::Tensor y = at::zeros_like(x);
  if (outs.empty()) return y;
  const at::Tensor weighted = at::cat(outs) * gate.index_select(0, order).unsqueeze(1).to(x.scalar_type());
  return y.index_add(0, rows, weighted);
}

}  // namespace meshtrain
