// DeepSpeed's model-state memory estimators, reproduced as its convention
// beside the planner's own ledger (`meshtrain plan --convention deepspeed`):
// deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs
// and stage3.estimate_zero3_model_states_mem_needs (DeepSpeed
// docs/code-docs/source/memory.rst). They count model states only
// (parameters, gradients, Adam) per GPU and per node's CPU, with optimizer
// (and, for ZeRO-3, parameter) offload, a 1.5x host buffer factor, and for
// ZeRO-3 the largest layer gathered on the GPU (4 bytes per parameter: 16-bit
// weights and gradients). Their conventions differ from the ZeRO paper's
// (arXiv 1910.02054, K = 12): ZeRO-2 keeps 4 bytes of 16-bit weights and
// gradients per parameter unsharded on each GPU, and ZeRO-3 counts 18 bytes
// per parameter sharded (16 of fp32 states + 2 of 16-bit weights).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

struct DeepSpeedEstimate {
  double cpu_bytes = 0;  // per node
  double gpu_bytes = 0;  // per GPU
  std::string options;   // as DeepSpeed prints them: "offload_optimizer=cpu", ...
};

// estimate_zero2_model_states_mem_needs_all_cold: offload_optimizer=cpu, then none.
std::vector<DeepSpeedEstimate> deepspeed_zero2(double total_params, int gpus_per_node, int nodes,
                                               double buffer_factor = 1.5);
// estimate_zero3_model_states_mem_needs_all_cold: (offload_param, offload_optimizer) in (cpu, cpu),
// (none, cpu), (none, none), each with zero_init 1 then 0.
std::vector<DeepSpeedEstimate> deepspeed_zero3(double total_params, double largest_layer_params, int gpus_per_node,
                                               int nodes, double buffer_factor = 1.5);

// DeepSpeed's largest layer: the module with the most parameters of its own (the embedding, the output
// head, or the widest linear).
double largest_layer_params(const ModelSpec& m);

// The table DeepSpeed prints ("per CPU | per GPU | Options", GB = 2^30 bytes).
std::string format_deepspeed(int stage, double total_params, double largest_layer, int gpus_per_node, int nodes,
                             const std::vector<DeepSpeedEstimate>& rows);

}  // namespace meshtrain::plan
