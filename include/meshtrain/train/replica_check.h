// Silent data corruption (seed 003, the hardware layer: a bad GPU or memory
// bit that changes a number without an error): replicas of the same
// parameters must hold the same bits after every update. They are the ranks of
// the data-parallel x context-parallel group of one tp/pp coordinate under
// DDP and ZeRO-1/2 (which all-gather the updated slices). Each rank hashes each
// parameter's bytes (XXH64), the hashes are all-gathered over the group, and a
// parameter whose hashes disagree names the ranks off the majority; with two
// replicas there is no majority, and both are named.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/nn/params.h"

namespace meshtrain {

class Comm;

struct ReplicaMismatch {
  std::string param;        // the first parameter (in model order) whose replicas differ
  std::vector<int> ranks;   // world ranks off the majority (both, without one)
  int replicas = 0;         // the group's size
};

// Collective over `replicas`. Every rank gets the same answer: empty when all
// parameters agree.
std::vector<ReplicaMismatch> compare_replicas(const std::vector<Param>& params, Comm& replicas);

// One line per mismatch: "layers.0.attn.q.weight differs on rank 2 (1 of 4 replicas)".
std::string replica_report(const std::vector<ReplicaMismatch>& m);

}  // namespace meshtrain
