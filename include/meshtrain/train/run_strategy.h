// A training config as the planner sees it (plan/strategy.h): the mesh, the
// schedule, the attention kernel and loss the run will take, the batch and the
// precision. The memory ledger, the startup estimate and the checks before
// ranks start all read the run through it, so they describe what the engine builds.
#pragma once

#include "meshtrain/plan/strategy.h"

namespace meshtrain {

struct TrainConfig;

// The planner's description of the run, with `dp` data-parallel replicas (dp x ep).
plan::Strategy strategy_of(const TrainConfig& c, int dp);

}  // namespace meshtrain
