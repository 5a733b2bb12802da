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

// How the command runs ([rl] reward_command, reward_shell, reward_timeout). Without `shell`
// the command is split into words (command_words, platform/subprocess.h) and started with
// posix_spawn: no shell sees it. With `shell`, /bin/sh -c runs it.
struct RewardCommand {
  std::string command;
  bool shell = false;
  double timeout_s = 60;  // the command is killed (with its process group) after this long
};

// Scores of `completions` (one per example) from one run of the command, its standard
// input and output files in a private directory (mkdtemp, mode 0700, removed afterwards).
// Throws std::runtime_error as above, and when the command cannot start or outlives its
// timeout.
std::vector<double> command_rewards(const RewardCommand& command, const std::vector<TaskExample>& examples,
                                    const std::vector<std::vector<int64_t>>& completions);

}  // namespace meshtrain
