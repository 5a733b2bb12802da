// The keys of the RL methods' sections ([rl], [grpo], [ppo]; rl/settings.h), registered with the
// methods (rl/methods.cpp).
#include "meshtrain/rl/config_keys.h"

#include "meshtrain/rl/settings.h"
#include "meshtrain/train/config_keys.h"

namespace meshtrain {

#define RL(member) [](auto& c) -> auto& { return settings<RlSettings>(c).member; }
#define GRPO(member) [](auto& c) -> auto& { return settings<GrpoSettings>(c).member; }
#define PPO(member) [](auto& c) -> auto& { return settings<PpoSettings>(c).member; }

std::vector<ConfigKey> rl_config_keys() {
  using namespace config_key;
  return {
      text("rl.task", RL(task), "arithmetic | reverse", "the shipped task"),
      text("rl.prompts", RL(prompts), "", "task prompts (JSONL, meshtrain tokenize task)"),
      text("rl.eval", RL(eval), "", "held-out task examples"),
      text("rl.reward_command", RL(reward_command), "",
           "a program that scores completions (split into words, no shell: rl/reward.h)"),
      boolean("rl.reward_shell", RL(reward_shell), "run rl.reward_command through /bin/sh -c"),
      number("rl.reward_timeout", RL(reward_timeout), 0, true, kInf, false,
             "seconds one call of rl.reward_command may take (then it is killed)"),
      text("rl.reward_model", RL(reward_model), "", "a reward model checkpoint"),
      text("rl.environment", RL(environment), "\"\" | calculator", "multi-turn environment"),
      integer("rl.max_turns", RL(max_turns), 1, kMaxInt, "policy turns per episode"),
      integer("rl.group", RL(group), 1, kMaxInt, "completions per prompt"),
      integer("rl.max_new", RL(max_new), 1, kMaxInt, "tokens per completion (per turn)"),
      integer("rl.epochs", RL(epochs), 1, kMaxInt, "optimizer steps per rollout batch"),
      integer("rl.eval_examples", RL(eval_examples), 1, kMaxInt, "held-out examples per evaluation"),
      number("rl.temperature", RL(temperature), 0, false, kInf, false, "sampling temperature"),
      number("rl.epsilon", RL(epsilon), 0, false, kInf, false, "ratio clip below 1"),
      number("rl.epsilon_high", RL(epsilon_high), 0, false, kInf, false, "ratio clip above 1"),
      number("grpo.beta", GRPO(beta), 0, false, kInf, false, "KL weight (a frozen reference when > 0)"),
      boolean("grpo.kl_ratio", GRPO(kl_ratio), "the KL term times the importance ratio (trl's use_bias_correction_kl)"),
      text("grpo.loss", GRPO(loss), "grpo | bnpo | dr_grpo | dapo", "how token losses are averaged"),
      number("ppo.kl_coef", PPO(kl_coef), 0, false, kInf, false, "KL penalty in the reward"),
      text("ppo.kl_estimator", PPO(kl_estimator), "k1 | k3", "KL estimator"),
      number("ppo.gamma", PPO(gamma), 0, false, 1, false, "discount"),
      number("ppo.lambda", PPO(lambda), 0, false, 1, false, "GAE lambda"),
      number("ppo.value_clip", PPO(value_clip), 0, true, kInf, false, "value loss clip"),
      number("ppo.vf_coef", PPO(vf_coef), 0, true, kInf, false, "value loss weight"),
      number("ppo.critic_lr", PPO(critic_lr), 0, false, kInf, false, "critic learning rate (0: train.lr)"),
      boolean("ppo.whiten", PPO(whiten), "whiten advantages over the global batch"),
  };
}

#undef RL
#undef GRPO
#undef PPO

}  // namespace meshtrain
