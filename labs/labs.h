// The seed's LLM Lab 01-03 as programs run under the launcher:
//   meshtrain lab 01 [--nproc N]    (starts N ranks itself when not launched)
// Each lab checks its own numbers and returns non-zero when they are wrong.
#pragma once

namespace meshtrain {
class Runtime;
}

namespace meshtrain::labs {

int lab01_allreduce(Runtime& rt);
int lab02_data_parallel(Runtime& rt);
int lab03_autograd_allreduce(Runtime& rt);

}  // namespace meshtrain::labs
