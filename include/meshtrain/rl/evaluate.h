// A model's accuracy on a shipped task (data/tasks.h): greedy (or sampled)
// episodes of every prompt (rl/episode.h: single-turn completions, or
// multi-turn with an environment), their answers scored by the task's reward.
// Any tp group (its ranks generate together).
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/tasks.h"

namespace meshtrain {

class Environment;
class Transformer;

struct TaskScore {
  int64_t examples = 0, exact = 0;
  double reward = 0;  // mean total reward
  double accuracy() const { return examples ? static_cast<double>(exact) / static_cast<double>(examples) : 0; }
};

// `temperature` 0: greedy; above 0: one sample per prompt at that temperature,
// seeded by `seed` and the prompt's index (the same on every run and rank).
// `env`: episodes of at most max_turns turns (null: one completion each).
TaskScore evaluate_task(Transformer& m, const std::vector<TaskExample>& examples, int64_t max_new_tokens,
                        int64_t batch = 64, double temperature = 0, uint64_t seed = 0, Environment* env = nullptr,
                        int64_t max_turns = 1);

}  // namespace meshtrain
