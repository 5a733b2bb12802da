// The methods rl/ holds, registered with the trainer core (train/method.h):
// "reward" (a Bradley-Terry reward model, rl/reward_model.h), "grpo" and
// "ppo" (their own loop: rollouts, then updates, rl/rl_trainer.h).
#pragma once

namespace meshtrain {

// Registers them; later calls do nothing. main() calls it before reading a
// config (the CLI, the test binaries); a program linking the library calls it
// to train with them.
void register_rl_methods();

}  // namespace meshtrain
