// The RL methods' config keys (rl/settings.h's sections), for train/config_keys.h's registry.
#pragma once

#include <vector>

namespace meshtrain {

struct ConfigKey;

std::vector<ConfigKey> rl_config_keys();

}  // namespace meshtrain
