// Rewards for RL (rl/rl_trainer.h): the shipped task's (data/tasks.h), a
// C++ callback, or an external command for user code.
//
// The command protocol: the trainer writes one JSON object per completion,
//   {"prompt": "...", "answer": "...", "completion": "..."}
// (the completion's text up to its end token), to the command's standard
// input, and reads one number per line, in order, from its standard output. A
// command that exits non-zero, prints a line that is not a number, or prints
// another count of lines is one error naming the command and the problem.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/data/tasks.h"

namespace meshtrain {

// Reward of one completion (its generated ids, the end token included when generated).
using RewardFn = std::function<double(const TaskExample& example, const std::vector<int64_t>& completion)>;

// The shipped task's reward: exact + format.
RewardFn task_reward_fn();

// Scores of `completions` (one per example) from `command`, run once through
// /bin/sh with files in `scratch_dir`. Throws std::runtime_error as above.
std::vector<double> command_rewards(const std::string& command, const std::vector<TaskExample>& examples,
                                    const std::vector<std::vector<int64_t>>& completions, const std::string& scratch_dir);

}  // namespace meshtrain
