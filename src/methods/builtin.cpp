#include "meshtrain/methods/builtin.h"

#include "meshtrain/dpo/method.h"
#include "meshtrain/rl/methods.h"

namespace meshtrain {

void register_builtin_methods() {
  register_dpo_method();   // dpo
  register_rl_methods();   // reward, grpo, ppo
}

}  // namespace meshtrain
