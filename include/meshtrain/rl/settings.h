// The config sections the RL methods read ([rl] for grpo and ppo, [grpo], [ppo]): each its own
// struct, kept in TrainConfig::method_settings (train/config.h's settings<T>), its keys declared in
// rl/config_keys.cpp and registered with the methods (rl/methods.h).
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/train/config.h"

namespace meshtrain {

// [rl] (train.method = "grpo" or "ppo", rl/rl_trainer.h): prompts and eval are {"prompt",
// "answer"} JSONL of a shipped task (meshtrain tokenize task); train.global_batch counts prompts
// per step, each with `group` completions; `epochs` optimisation steps over each rollout batch,
// the policy's ratio clipped to [1 - epsilon, 1 + epsilon_high].
struct RlSettings {
  static constexpr const char* kSection = "rl";
  std::string task = "arithmetic", prompts, eval;
  std::string reward_command;  // "" = the task's reward; else rl/reward.h's protocol
  bool reward_shell = false;   // run reward_command through /bin/sh -c (else split into words, no shell)
  double reward_timeout = 60;  // seconds one call of reward_command may take
  std::string reward_model;    // a checkpoint of train.method = "reward": its score replaces the task's (rl/reward_model.h)
  // A multi-turn environment (rl/environment.h: "calculator"; "" single-turn),
  // at most max_turns policy turns of at most max_new tokens each.
  std::string environment;
  int64_t max_turns = 4;
  int64_t group = 8, max_new = 8, epochs = 1, eval_examples = 256;
  double temperature = 1.0, epsilon = 0.2, epsilon_high = 0.2;
};

// [grpo] beta (the k3 KL's weight; a frozen reference when > 0), kl_ratio (the KL weighted by the
// importance ratio, trl's use_bias_correction_kl), loss (rl/grpo.h).
struct GrpoSettings {
  static constexpr const char* kSection = "grpo";
  double beta = 0.0;
  bool kl_ratio = false;
  std::string loss = "dapo";
};

// [ppo] (rl/ppo.h; TRL's defaults): the KL penalty in the reward (kl_coef, kl_estimator k1 | k3),
// GAE's gamma and lambda, the critic's value clip, loss weight and learning rate (0: train.lr),
// whether advantages are whitened.
struct PpoSettings {
  static constexpr const char* kSection = "ppo";
  double kl_coef = 0.05, gamma = 1.0, lambda = 0.95, value_clip = 0.2, vf_coef = 0.1, critic_lr = 0;
  std::string kl_estimator = "k1";
  bool whiten = true;
};

inline const RlSettings& rl_settings(const TrainConfig& c) { return settings<RlSettings>(c); }
inline const GrpoSettings& grpo_settings(const TrainConfig& c) { return settings<GrpoSettings>(c); }
inline const PpoSettings& ppo_settings(const TrainConfig& c) { return settings<PpoSettings>(c); }

}  // namespace meshtrain
