#include "meshtrain/rl/critic.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/ppo.h"

namespace meshtrain {

void add_value_head(Transformer& m) {
  ParamStore& store = m.params();
  const int64_t h = m.spec().hidden;
  for (auto& p : store.params()) {
    if (p.name == "head.weight") {
      p.frozen = true;
      p.tensor.requires_grad_(false);
    }
  }
  store.create("value_head.weight", {1, h}, Init::Normal, 1.0 / static_cast<double>(h + 1), -1);
  store.create("value_head.bias", {1}, Init::Zeros, 0, -1);
}

bool has_value_head(Transformer& m) {
  for (const auto& p : m.params().params()) {
    if (p.name == "value_head.weight") return true;
  }
  return false;
}

at::Tensor values(Transformer& m, const at::Tensor& tokens, bool train) {
  const at::Tensor h = m.final_hidden(tokens, train);  // [s, b, h]
  const at::Tensor w = m.params().find("value_head.weight").tensor, b = m.params().find("value_head.bias").tensor;
  return at::linear(h.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat)).squeeze(-1).t();  // [b, s]
}

Batch ValueObjective::rows(const std::vector<uint64_t>& ids) const { return row_batch(batch_.tokens, ids); }

double ValueObjective::units(const Batch& b) const { return rows_of(batch_.mask, b).sum().item<double>(); }

at::Tensor ValueObjective::loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) {
  const at::Tensor mask = rows_of(batch_.mask, b), ret = rows_of(batch_.returns, b);
  const int64_t T = b.tokens.size(1) - 1;
  const at::Tensor v = values(m, b.tokens, train).narrow(1, 0, T);
  const ValueTerms t = value_loss(v, rows_of(batch_.old_values, b), ret, mask, clip_);
  const double tokens = mask.sum().item<double>();
  metric_sums.at(0) += t.clipped * tokens;
  metric_sums.at(1) += ((v.detach() - ret).pow(2) * mask).sum().item<double>();
  return coef_ * t.loss;
}

}  // namespace meshtrain
