// meshtrain launch [--nproc-per-node N] [--nnodes N --node-rank I --master-addr A --master-port P]
//                  [--max-restarts K] PROGRAM [ARGS...]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/runtime/launcher.h"

namespace meshtrain::cli {

Run add_launch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  auto cmd = app.add_subcommand("launch", "start the ranks of this node (torchrun-compatible)");
  cmd->add_option("--nproc-per-node,--nproc_per_node", o->nproc_per_node, "ranks on this node");
  cmd->add_option("--nnodes", o->nnodes, "number of nodes");
  cmd->add_option("--node-rank,--node_rank", o->node_rank, "this node's index, 0..nnodes-1");
  cmd->add_option("--master-addr,--master_addr", o->master_addr, "host of rank 0 (rendezvous)");
  cmd->add_option("--master-port,--master_port", o->master_port, "rendezvous port; 0 picks a free one (one node)");
  cmd->add_option("--max-restarts,--max_restarts", o->max_restarts, "restart all local ranks up to K times");
  cmd->add_option("--grace", o->grace_seconds, "seconds between SIGTERM and SIGKILL when stopping ranks");
  cmd->prefix_command();
  return [o, cmd]() {
    o->command = cmd->remaining();
    if (!o->command.empty() && o->command[0] == "--") o->command.erase(o->command.begin());
    // `meshtrain launch lab 01` runs this binary's own subcommand.
    const auto& names = subcommand_names();
    if (!o->command.empty() && std::find(names.begin(), names.end(), o->command[0]) != names.end()) {
      o->command.insert(o->command.begin(), self_exe());
    }
    return launch(*o);
  };
}

}  // namespace meshtrain::cli
