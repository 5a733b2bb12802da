#include "meshtrain/moe/metrics.h"

#include <ATen/Functions.h>

#include <algorithm>

#include "meshtrain/comm/comm.h"
#include "meshtrain/moe/layer.h"

namespace meshtrain {

MoeMetrics collect_moe_metrics(const std::vector<MoeLayer*>& layers, const std::vector<Comm*>& groups) {
  MoeMetrics out;
  if (layers.empty()) return out;
  // One flat vector: per layer [tokens per expert..., assignments, dropped, aux, z, forwards].
  std::vector<double> flat;
  for (MoeLayer* l : layers) {
    const MoeStats& s = l->stats();
    flat.insert(flat.end(), s.tokens.begin(), s.tokens.end());
    flat.insert(flat.end(), {s.assignments, s.dropped, s.aux, s.z, s.forwards});
    l->stats().reset();
  }
  at::Tensor t = at::tensor(flat, at::kDouble);
  for (Comm* g : groups) {
    if (g && g->size() > 1) g->all_reduce(t);
  }
  const double* v = t.data_ptr<double>();
  double imbalance = 0, assignments = 0, dropped = 0, aux = 0, z = 0, forwards = 0;
  for (MoeLayer* l : layers) {
    const int64_t E = l->experts();
    std::vector<double> tokens(v, v + E);
    v += E;
    double total = 0, most = 0;
    for (double x : tokens) {
      total += x;
      most = std::max(most, x);
    }
    imbalance += total > 0 ? most / (total / static_cast<double>(E)) : 0;
    assignments += v[0];
    dropped += v[1];
    aux += v[2];
    z += v[3];
    forwards += v[4];
    v += 5;
    out.tokens.push_back(std::move(tokens));
  }
  const double n = static_cast<double>(layers.size());
  out.values = {{"moe_imbalance", imbalance / n},
                {"moe_dropped", assignments > 0 ? dropped / assignments : 0},
                {"moe_aux", forwards > 0 ? aux / forwards : 0},
                {"moe_z", forwards > 0 ? z / forwards : 0}};
  return out;
}

}  // namespace meshtrain
