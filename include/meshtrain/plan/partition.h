// Pipeline stage partitioning: which layers each (virtual) stage holds.
//
// Stage 0 also holds the embedding (and learned positions); the last stage
// the final norm and the head — with tied embeddings, a copy of the embedding
// whose gradient is summed with stage 0's (Megatron-LM keeps both copies
// identical the same way). Default: contiguous layer ranges that minimise
// the largest stage's parameter count (so the embedding-heavy first and last
// stages get fewer layers). Or the user's list of layers per stage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/spec.h"

namespace meshtrain::plan {

// What "balanced" balances. Parameters: every stage's parameter count (the
// default; memory). Compute: matmul work per token, where the embedding
// lookup costs nothing and the head (or tied embedding used as the head)
// costs its V x h multiply — measured on gpt2-124m pp=2, parameter balance
// leaves stage 0 light and the last stage heavy (docs/bench-pipeline.md).
enum class Balance { Parameters, Compute };
// "parameters" | "compute"; throws std::invalid_argument naming the value.
Balance parse_balance(const std::string& s);
const char* balance_name(Balance b);

struct StageRange {
  int64_t first = 0, last = 0;  // layers [first, last)
  int64_t params = 0;           // parameters of the stage (embedding / head included)
  int64_t work = 0;             // matmul work per token in weights: the layers', plus the head's V x h
                                // on the last stage (the embedding lookup is free), whatever the balance
};

// `stages` = pp x v. `layers_per_stage`: empty for balanced, else one count
// per stage. Throws std::invalid_argument naming the numbers when there are
// fewer layers than stages, or the list's length or sum is wrong, or a count is < 1.
std::vector<StageRange> partition_layers(const ModelSpec& m, int stages,
                                         const std::vector<int64_t>& layers_per_stage = {},
                                         Balance balance = Balance::Parameters);

}  // namespace meshtrain::plan
