// Strategy search: enumerate (tp, pp, v, cp, ep, dp, zero, recomputation,
// micro-batch) under the rules (tp within a node, divisibility, memory fits),
// rank by estimated step time, and explain the choice in the seeds' order:
// doesn't fit -> redundant state? ZeRO/FSDP -> a layer too big? TP(+SP) ->
// too many layers? PP -> sequence too long? CP -> activations? recomputation
// / accumulation; not fast enough -> DP.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/plan/estimate.h"
#include "meshtrain/plan/memory.h"

namespace meshtrain::plan {

// Choices the user fixed (empty = searched).
struct Fixed {
  std::optional<int> tp, pp, vpp, cp, ep, dp, zero;
  std::optional<int64_t> micro_batch;
  std::optional<Recompute> recompute;
  std::optional<bool> sp;  // sequence parallelism with tp > 1 (default on; off: Korthikanti's tp without SP)
  std::optional<bool> offload;  // optimizer offload to the host (default off)
  std::optional<bool> flash;    // flash-style attention (default: where the GPU has such kernels)
  bool sac_op = false;          // selective recomputation is torchtitan's per-op policy (Strategy::sac_op)
  bool bf16_optimizer = false;  // Adam's states in bf16 (Strategy::bf16_optimizer; never searched)
  bool fp8_params = false;      // FP8 weights alone (Strategy::fp8_params; never searched)
};

struct SearchInput {
  ModelSpec model;
  GpuSpec gpu;
  int gpus = 1;
  int64_t seq = 0;
  int64_t global_batch = 1;
  Precision precision = Precision::Bf16;
  Fixed fixed;
  EstimateOptions estimate;
  MemoryOptions memory;
};

struct Candidate {
  Strategy strategy;
  MemoryPlan memory;
  StepEstimate estimate;
  double peak_bytes = 0;
};

struct SearchResult {
  std::vector<Candidate> ranked;     // feasible, fastest first
  std::optional<Candidate> leanest;  // smallest peak memory of all valid ones (for "nothing fits")
  int considered = 0;
  int feasible = 0;
  std::vector<std::string> explanation;
  std::vector<std::string> rules;  // every rule the search applied, with what it rejected (--explain)
};

// The search's enumeration helpers: the divisors of n up to limit; a fixed choice, or all of them.
std::vector<int> divisors(int n, int64_t limit);
template <typename T>
std::vector<T> choices(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

// Throws std::invalid_argument for bad input (gpus not a positive multiple of
// what the fixed choices need, negative sizes).
SearchResult search(const SearchInput& in);

// The explanation's helpers (mesh_order, why_slower) live in plan/explain.h.

}  // namespace meshtrain::plan
