// `meshtrain train` with train.method = "grpo": GRPO (rl/grpo.h) on a shipped
// task (data/tasks.h) over data-parallel ranks.
//
// Step s takes train.global_batch prompts from a seeded permutation of
// grpo.prompts (epoch by epoch); data-parallel rank r generates its share,
// grpo.group completions each (rl/rollout.h, prompts batched by length), with
// a seed per completion from (seed, step, prompt, completion): rollouts do not
// depend on the number of ranks. Rewards are the task's; advantages are
// normalised within each group (whole on one rank). Then grpo.epochs
// optimisation steps over the rollout batch, each one TrainStep (DDP, clipping,
// AdamW) over micro-batches of train.micro_batch completions, with
// GrpoObjective (rl/grpo_objective.h). Logged per step: reward mean and std,
// rollout accuracy, completion length, KL, clip fractions, rollout and
// training seconds; greedy accuracy on grpo.eval every train.eval_every steps.
#pragma once

#include "meshtrain/rl/reward.h"

namespace meshtrain {

class Runtime;
struct TrainConfig;

// `reward`: a C++ callback for user code (null: grpo.reward_command when set,
// else the task's reward).
int train_grpo(const TrainConfig& c, Runtime& rt, const RewardFn* reward = nullptr);

}  // namespace meshtrain
