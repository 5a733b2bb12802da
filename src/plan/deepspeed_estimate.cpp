#include "meshtrain/plan/deepspeed_estimate.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>


namespace meshtrain::plan {

std::vector<DeepSpeedEstimate> deepspeed_zero2(double params, int gpus_per_node, int nodes, double buffer) {
  const double gpus = static_cast<double>(gpus_per_node) * nodes;
  // offload: 16-bit weights only on the GPU; the host holds fp32 weights, gradients and Adam (16 B), or the
  // model's fp32 copy per GPU process while it loads (4 B x GPUs), whichever is larger.
  DeepSpeedEstimate offload{params * std::max(4 * gpus, 16.0) * buffer, 2 * params, "offload_optimizer=cpu"};
  // none: 16-bit weights and gradients whole (4 B), fp32 states sharded (16 B / GPUs); the host only loads.
  DeepSpeedEstimate none{params * 4 * gpus_per_node * buffer, 4 * params + std::floor(16 * params / gpus),
                         "offload_optimizer=none"};
  return {offload, none};
}

std::vector<DeepSpeedEstimate> deepspeed_zero3(double params, double largest, int gpus_per_node, int nodes,
                                               double buffer) {
  const double gpus = static_cast<double>(gpus_per_node) * nodes, per_node = 1.0 / nodes;
  const double layer = 4 * largest;  // the largest layer gathered: 16-bit weights + gradients
  std::vector<DeepSpeedEstimate> rows;
  for (int init : {1, 0}) {  // offload_param=cpu, offload_optimizer=cpu
    rows.push_back({params * (init ? 18 * per_node : std::max(4.0 * gpus_per_node, 18 * per_node)) * buffer, layer,
                    fmt::format("offload_param=cpu , offload_optimizer=cpu , zero_init={}", init)});
  }
  for (int init : {1, 0}) {  // offload_param=none, offload_optimizer=cpu
    rows.push_back({params * (init ? 16 * per_node : std::max(4.0 * gpus_per_node, 16 * per_node)) * buffer,
                    layer + std::floor(2 * params / gpus),
                    fmt::format("offload_param=none, offload_optimizer=cpu , zero_init={}", init)});
  }
  for (int init : {1, 0}) {  // no offload: zero.Init builds layer by layer on the host, else the whole model
    rows.push_back({(init ? largest : params) * 4 * gpus_per_node * buffer, layer + std::floor(18 * params / gpus),
                    fmt::format("offload_param=none, offload_optimizer=none, zero_init={}", init)});
  }
  return rows;
}

double largest_layer_params(const ModelSpec& m) {
  // Hugging Face modules: the token embedding (and an untied head) of vocab x h, q / k / v / o and each FFN
  // projection (gate, up, down; GPT-2's c_fc) separately: the widest is ffn x h.
  const double h = static_cast<double>(m.hidden);
  return std::max(static_cast<double>(m.vocab) * h, static_cast<double>(m.ffn) * h);
}

std::string format_deepspeed(int stage, double params, double largest, int gpus_per_node, int nodes,
                             const std::vector<DeepSpeedEstimate>& rows) {
  std::string out = "Estimated memory needed for params, optim states and gradients for a:\n";
  out += fmt::format("HW: Setup with {} node{}, {} GPU{} per node.\n", nodes, nodes == 1 ? "" : "s", gpus_per_node,
                     gpus_per_node == 1 ? "" : "s");
  out += stage == 3 ? fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                                  static_cast<int64_t>(params / 1e6), static_cast<int64_t>(largest / 1e6))
                    : fmt::format("SW: Model with {}M total params.\n", static_cast<int64_t>(params / 1e6));
  out += "  per CPU  |  per GPU |   Options\n";
  const double gib = 1 << 30;
  for (const auto& r : rows) out += fmt::format("  {:7.2f}GB | {:6.2f}GB | {}\n", r.cpu_bytes / gib, r.gpu_bytes / gib, r.options);
  return out;
}

}  // namespace meshtrain::plan
