// The methods rl/ holds, registered with the trainer core (train/method.h):
// "reward" (a Bradley-Terry reward model, rl/reward_model.h), "grpo" and
// "ppo" (their own loop: rollouts, then updates, rl/rl_trainer.h).
#pragma once

namespace meshtrain {

// Registers them with their sections; later calls do nothing (methods/builtin.h
// calls it).
void register_rl_methods();

}  // namespace meshtrain
