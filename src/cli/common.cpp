#include <unistd.h>

#include <chrono>
#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/launcher.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::cli {
namespace {
std::vector<std::string> g_argv;
}

const std::vector<std::string>& subcommand_names() {
  static const std::vector<std::string> names{"bench", "lab", "mesh", "train"};
  return names;
}

void set_argv(int argc, char** argv) { g_argv.assign(argv, argv + argc); }
const std::vector<std::string>& original_argv() { return g_argv; }

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

int relaunch_if_needed(int nproc) {
  if (DistEnv::from_environment().distributed() || nproc <= 1) return -1;
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.master_port = 0;
  o.command = g_argv;
  o.command[0] = self_exe();
  return launch(o);
}

std::unique_ptr<Runtime> start_runtime(double timeout_s) {
  if (!(timeout_s > 0)) {
    throw std::invalid_argument(fmt::format("--timeout {} must be a positive number of seconds", timeout_s));
  }
  RuntimeOptions opts;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return Runtime::init(DistEnv::from_environment(), opts);
}

}  // namespace meshtrain::cli
