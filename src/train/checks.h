// The planner held against the runtime (--check-plan): the planner's bytes for
// this rank beside what the runtime measured in the first step.
#pragma once

#include <map>
#include <string>

#include "meshtrain/train/config.h"

namespace meshtrain {

class TrainEngine;

// `comm`: bytes moved per axis in the first step (comm.h's moved_bytes);
// `print`: this rank prints the table. Throws std::runtime_error when a
// number differs from the plan by more than 5%.
void check_plan(const TrainConfig& c, TrainEngine& engine, const std::map<std::string, double>& comm, int dp,
                int pp_rank, bool print);

}  // namespace meshtrain
