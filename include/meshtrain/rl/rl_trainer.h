// `meshtrain train` with train.method = "grpo" or "ppo": reinforcement
// learning on a shipped task (data/tasks.h) over data-parallel (and
// tensor-parallel) ranks.
//
// Step s takes train.global_batch prompts from a seeded permutation of
// rl.prompts (epoch by epoch); data-parallel rank r generates its share,
// rl.group completions each (rl/rollout.h, prompts batched by length), with
// a seed per completion from (seed, step, prompt, completion): rollouts do not
// depend on the number of ranks. Rewards are the task's (or the user's).
//
//   GRPO (rl/grpo.h): advantages normalised within each group (whole on one
//   rank); the k3 KL to a frozen reference in the loss when grpo.beta > 0.
//   PPO (rl/ppo.h): a critic (the policy's trunk + a value head, rl/critic.h,
//   its own optimizer) values each position at rollout; the reference's
//   log-probs give the KL penalty in the per-token reward; GAE gives per-token
//   advantages, whitened over the global batch, and the critic's returns.
//
// Then rl.epochs optimisation steps over the rollout batch: the actor's
// (GrpoObjective, rl/grpo_objective.h) and under PPO the critic's
// (ValueObjective), each one TrainStep (DDP, clipping, AdamW) over
// micro-batches of train.micro_batch completions. Logged per step: reward mean
// and std, rollout accuracy, completion length, KL, clip fractions, entropy,
// (PPO) value clip fraction and error, rollout and training seconds, peak
// memory; greedy and sampled accuracy on rl.eval every train.eval_every steps.
// Checkpoints hold the actor (the critic is not saved; RL runs do not resume yet).
#pragma once

#include "meshtrain/rl/reward.h"

namespace meshtrain {

class Runtime;
struct TrainConfig;

// `reward`: a C++ callback for user code (null: rl.reward_command when set,
// else the task's reward).
int train_rl(const TrainConfig& c, Runtime& rt, const RewardFn* reward = nullptr);

}  // namespace meshtrain
