#include "meshtrain/moe/metrics.h"

#include <ATen/Functions.h>

#include <algorithm>

#include "meshtrain/comm/comm.h"
#include "meshtrain/moe/layer.h"

namespace meshtrain {

MoeMetrics collect_moe_metrics(const std::vector<MoeLayer*>& layers, const std::vector<Comm*>& groups,
                               const plan::ModelSpec& spec) {
  MoeMetrics out;
  const int64_t total = spec.moe_layer_count();
  if (total == 0) return out;
  // One slot per MoE layer of the model, [tokens per expert..., assignments, dropped, aux, z, forwards]; this
  // rank fills its layers' slots (a pipeline stage holds some of them), the sums over the groups fill the rest.
  const int64_t width = spec.experts + 5;
  at::Tensor flat = at::zeros({total, width}, at::kDouble);
  for (MoeLayer* l : layers) {
    MoeStats& s = l->stats();
    at::Tensor row = flat[l->index()];
    row.narrow(0, 0, spec.experts).copy_(at::tensor(s.tokens, at::kDouble));
    row.narrow(0, width - 5, 5).copy_(at::tensor({s.assignments, s.dropped, s.aux, s.z, s.forwards}, at::kDouble));
    s.reset();
  }
  for (Comm* g : groups) {
    if (g && g->size() > 1) g->all_reduce(flat);
  }
  double imbalance = 0, assignments = 0, dropped = 0, aux = 0, z = 0, forwards = 0;
  for (int64_t i = 0; i < total; ++i) {
    const double* v = flat[i].data_ptr<double>();
    std::vector<double> tokens(v, v + width - 5);
    double sum = 0, most = 0;
    for (double x : tokens) {
      sum += x;
      most = std::max(most, x);
    }
    imbalance += sum > 0 ? most / (sum / static_cast<double>(tokens.size())) : 0;
    const double* tail = v + width - 5;
    assignments += tail[0];
    dropped += tail[1];
    aux += tail[2];
    z += tail[3];
    forwards += tail[4];
    out.tokens.push_back(std::move(tokens));
  }
  out.values = {{"moe_imbalance", imbalance / static_cast<double>(total)},
                {"moe_dropped", assignments > 0 ? dropped / assignments : 0},
                {"moe_aux", forwards > 0 ? aux / forwards : 0},
                {"moe_z", forwards > 0 ? z / forwards : 0}};
  return out;
}

}  // namespace meshtrain
