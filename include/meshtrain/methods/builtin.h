// The methods meshtrain ships beside the core's (pretrain, sft: train/method.h),
// each in its folder: dpo/ (dpo), rl/ (reward, grpo, ppo). Adding a method is
// its folder and one line in src/methods/builtin.cpp.
#pragma once

namespace meshtrain {

// Registers them with their config sections; later calls do nothing. main()
// calls it before reading a config (the CLI, the test binaries); a program
// linking the library calls it to train with them.
void register_builtin_methods();

}  // namespace meshtrain
