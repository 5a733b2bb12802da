// The seed's LLM Lab 01-07 as programs run under the launcher:
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
int lab04_column_row(Runtime& rt);
int lab05_attention_heads(Runtime& rt);
int lab06_megatron_block(Runtime& rt);
int lab07_flash_attention(Runtime& rt);  // one process: `meshtrain lab 07 --nproc 1`

}  // namespace meshtrain::labs
