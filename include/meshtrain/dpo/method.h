// train.method = "dpo" (dpo/dpo.h), registered with the trainer core
// (train/method.h) with its [dpo] section (dpo/settings.h).
#pragma once

namespace meshtrain {

// Registers it; later calls do nothing (methods/builtin.h calls it).
void register_dpo_method();

}  // namespace meshtrain
