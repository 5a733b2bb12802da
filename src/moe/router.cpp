#include "meshtrain/moe/router.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

namespace meshtrain {

RouterKind parse_router(const std::string& s) {
  if (s == "softmax") return RouterKind::Softmax;
  if (s == "sigmoid") return RouterKind::Sigmoid;
  throw std::invalid_argument(fmt::format("unknown router \"{}\": use softmax or sigmoid", s));
}

Routing route(const at::Tensor& logits, const RouterOptions& o) {
  if (logits.dim() != 2 || logits.size(1) != o.experts) {
    throw std::invalid_argument(fmt::format("router logits must be [tokens, {}], got [{}]", o.experts,
                                            fmt::join(logits.sizes(), ", ")));
  }
  if (o.top_k < 1 || o.top_k > o.experts) {
    throw std::invalid_argument(fmt::format("top_k = {} must be in 1..experts ({})", o.top_k, o.experts));
  }
  if (o.kind == RouterKind::Sigmoid && o.top_k < 2) {
    throw std::invalid_argument("the sigmoid router normalises its gates over the top k: it needs top_k >= 2");
  }
  if (o.capacity_factor < 0) {
    throw std::invalid_argument(fmt::format("capacity_factor = {} must be > 0 (or 0: dropless)", o.capacity_factor));
  }
  const int64_t T = logits.size(0), E = o.experts, k = o.top_k;
  const at::Tensor x = logits.to(at::kFloat);
  Routing r;
  at::Tensor scores, density;  // scores pick the experts; density is P's per-token distribution
  if (o.kind == RouterKind::Softmax) {
    scores = at::softmax(x, 1);
    density = scores;
  } else {
    scores = at::sigmoid(x);
    density = scores / scores.sum(1, true);
  }
  auto [top, idx] = at::topk(scores, k, 1);
  r.expert = idx;
  at::Tensor gate = top;
  if (k > 1) gate = top / top.sum(1, true);
  // Capacity: assignments in priority order (choice j of every token before choice j + 1).
  const at::Tensor order = idx.t().reshape({-1});  // [k T], choice-major
  const at::Tensor onehot = at::one_hot(order, E);
  const at::Tensor position = (onehot.cumsum(0) - 1).gather(1, order.unsqueeze(1)).squeeze(1);  // place in its expert
  r.capacity = o.capacity_factor > 0 ? static_cast<int64_t>(std::ceil(o.capacity_factor * T * k / E)) : 0;
  r.kept = r.capacity > 0 ? (position < r.capacity).view({k, T}).t().contiguous() : at::ones({T, k}, at::kBool);
  r.gate = gate * r.kept.to(gate.scalar_type());
  r.dropped = T * k - r.kept.sum().item<int64_t>();
  r.per_expert = at::one_hot(idx.masked_select(r.kept), E).sum(0);
  // Losses.
  r.assigned = onehot.sum(0).to(at::kFloat);  // before dropping
  r.density_sum = density.sum(0);
  r.lse2_sum = at::logsumexp(x, 1).pow(2).sum();
  const double tokens = static_cast<double>(T);
  r.aux_loss = (r.assigned / (tokens * k) * (r.density_sum / tokens)).sum() * static_cast<double>(E);
  r.z_loss = r.lse2_sum / tokens;
  return r;
}

}  // namespace meshtrain
