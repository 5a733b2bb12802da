// A model's accuracy on a shipped task (data/tasks.h): greedy completions of
// every prompt (rl/rollout.h, prompts batched by length), scored by the task's
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

TaskScore evaluate_task(Transformer& m, const std::vector<TaskExample>& examples, int64_t max_new_tokens,
                        int64_t batch = 64);

}  // namespace meshtrain
