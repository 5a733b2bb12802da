// The course's typical configurations (seed 003, "7B / 70B / 1000-GPU"): each
// searched by the planner and printed with its plan, per-rank ledger,
// communication per axis and predicted step time (`meshtrain plan --typical`).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/search.h"

namespace meshtrain::plan {

struct TypicalRun {
  std::string title;
  SearchInput input;
};

// Llama 2 7B on one node of 8 H100, Llama 2 70B on 64 H100 (8 nodes), Llama 3 405B on 1024 H100: each at
// its published sequence length with a global batch of about 4M tokens (8M for the 1024-GPU run).
std::vector<TypicalRun> typical_runs();

// Each run's best plan as a Markdown section: the plan, its ledger, traffic per axis, the step.
std::string typical_report();

}  // namespace meshtrain::plan
