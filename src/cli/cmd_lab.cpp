// meshtrain lab NN [--nproc N]: the seed's LLM Labs (07 is one process: --nproc 1).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "labs/labs.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::cli {

Run add_lab(CLI::App& app) {
  struct Opts {
    std::string id;
    int nproc = 4;
    double timeout = 300;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("lab", "the course's LLM Labs 01-07: 01 all_reduce, 02 data parallel, 03 autograd, 04 column/row, 05 heads, 06 block, 07 flash attention");
  cmd->add_option("id", o->id, "lab number: 01 to 07")->required();
  cmd->add_option("--nproc", o->nproc, "ranks to start when not under a launcher");
  cmd->add_option("--timeout", o->timeout, "collective timeout in seconds");
  return [o]() {
    static const std::map<std::string, std::function<int(Runtime&)>> labs{
        {"01", labs::lab01_allreduce},     {"02", labs::lab02_data_parallel},
        {"03", labs::lab03_autograd_allreduce}, {"04", labs::lab04_column_row},
        {"05", labs::lab05_attention_heads}, {"06", labs::lab06_megatron_block},
        {"07", labs::lab07_flash_attention}};
    std::string id = o->id.size() == 1 ? "0" + o->id : o->id;
    auto it = labs.find(id);
    if (it == labs.end()) throw std::invalid_argument(fmt::format("no lab '{}'; labs are 01 to 07", o->id));
    if (int rc = relaunch_if_needed(o->nproc); rc >= 0) return rc;
    auto rt = start_runtime(o->timeout);
    return it->second(*rt);
  };
}

}  // namespace meshtrain::cli
