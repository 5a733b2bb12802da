// A step's mixture-of-experts metrics (the step log and the JSONL): what the
// MoE layers' training forwards recorded (moe/layer.h), summed over the ranks
// that saw different tokens.
//
//   moe_imbalance  max / mean of the tokens each expert kept, averaged over
//                  layers (1: balanced; E: one expert takes every token)
//   moe_dropped    assignments past capacity / all assignments
//   moe_aux        the load-balancing loss (Switch), mean over layers and
//                  micro-batches (1 when routing is uniform)
//   moe_z          the router z-loss (ST-MoE), the same mean
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "meshtrain/plan/spec.h"

namespace meshtrain {

class Comm;
class MoeLayer;

struct MoeMetrics {
  std::vector<std::pair<std::string, double>> values;  // the four above (none without MoE layers)
  std::vector<std::vector<double>> tokens;             // per layer: tokens kept per expert
};

// Sums the layers' stats over `groups` (one all-reduce per group: the
// data-parallel replicas, tp under sequence parallelism, pp whose stages hold
// different layers), then resets them: one entry per MoE layer of `spec`
// (each layer at its MoeLayer::index()). Every rank of the groups must call it.
MoeMetrics collect_moe_metrics(const std::vector<MoeLayer*>& layers, const std::vector<Comm*>& groups,
                               const plan::ModelSpec& spec);

}  // namespace meshtrain
