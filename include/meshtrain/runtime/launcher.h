// `meshtrain launch`: starts the ranks of one node, like torchrun.
//
// Each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT, MESHTRAIN_RESTART_COUNT, and the load-time variables
// of platform/threads.h. Every line a child prints is prefixed with "[rank N] ".
//
// Failure rule: when a child exits non-zero or is killed, the launcher sends
// SIGTERM to the others, SIGKILL after `grace_seconds`, then either restarts the
// whole local group (while restarts remain) or exits with the failing child's
// status, naming its rank. SIGINT/SIGTERM to the launcher are forwarded to every
// child; each child runs in its own process group and dies with the launcher
// (PR_SET_PDEATHSIG).
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0 = pick a free port (single node only)
  int max_restarts = 0;
  double grace_seconds = 5.0;
  std::vector<std::string> command;  // program and its arguments
};

// Checks the options; throws std::invalid_argument naming the value and the fix
// (including "port in use" on the master node).
void validate(LaunchOptions& opts);

// Runs the ranks to completion. Returns 0 when all exit 0; otherwise the failing
// child's exit code (128 + signal when killed), after printing which rank failed.
int launch(LaunchOptions opts);

// A free TCP port on `addr`, chosen by the kernel.
int pick_free_port(const std::string& addr);

}  // namespace meshtrain
