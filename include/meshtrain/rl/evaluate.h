// A model's accuracy on a shipped task (data/tasks.h): greedy (or sampled)
// completions of every prompt (rl/rollout.h, prompts batched by length), scored by the task's
// reward. One process, tp = 1.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/tasks.h"

namespace meshtrain {

class Transformer;

struct TaskScore {
  int64_t examples = 0, exact = 0;
  double reward = 0;  // mean total reward
  double accuracy() const { return examples ? static_cast<double>(exact) / static_cast<double>(examples) : 0; }
};

// `temperature` 0: greedy; above 0: one sample per prompt at that temperature,
// seeded by `seed` and the prompt's index (the same on every run and rank).
TaskScore evaluate_task(Transformer& m, const std::vector<TaskExample>& examples, int64_t max_new_tokens,
                        int64_t batch = 64, double temperature = 0, uint64_t seed = 0);

}  // namespace meshtrain
