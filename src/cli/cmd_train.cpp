// meshtrain train CONFIG.toml [--set section.key=value]... [--nproc N]
// Without launcher variables and with a mesh of several ranks, it starts them itself.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::cli {

Run add_train(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> sets;
    int nproc = 0;
    int max_restarts = 0;
    bool check_plan = false;
    bool print_config = false;
    bool help_config = false;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("train", "train a model from a TOML config (see configs/)");
  cmd->add_option("config", o->config, "CONFIG.toml");
  cmd->add_option("--set", o->sets, "override: section.key=value (repeatable)");
  cmd->add_option("--nproc", o->nproc, "ranks to start on this machine (default: [parallel] nproc)");
  cmd->add_option("--max-restarts", o->max_restarts,
                  "after a rank fails, restart every rank from the newest checkpoint that verifies, up to K times "
                  "(needs checkpoint.dir; resume \"auto\")");
  cmd->add_flag("--print-config", o->print_config,
                "print every config key with its value, type, allowed range and help (TOML), and exit");
  cmd->add_flag("--help-config", o->help_config,
                "print the training methods and every config key at its default (TOML, with type, range and help), "
                "and exit");
  cmd->add_flag("--check-plan", o->check_plan,
                "after the first step, compare the planner's per-rank bytes (states, traffic per axis) with the "
                "runtime's; fail beyond 5%");
  return [o]() {
    if (o->help_config) {
      fmt::print("{}", help_config());
      return 0;
    }
    if (o->config.empty()) throw std::invalid_argument("meshtrain train CONFIG.toml: the config is missing (--help-config lists every key)");
    if (o->nproc < 0) throw std::invalid_argument(fmt::format("--nproc {} must be at least 1", o->nproc));
    TrainConfig c = load_train_config(o->config, o->sets);
    if (o->print_config) {
      fmt::print("{}", print_config(c));
      return 0;
    }
    const int nproc = o->nproc > 0 ? o->nproc : c.nproc;
    if (o->max_restarts < 0) {
      throw std::invalid_argument(fmt::format("--max-restarts {} must be >= 0", o->max_restarts));
    }
    if (o->max_restarts > 0 && (c.ckpt_dir.empty() || c.resume != "auto")) {
      throw std::invalid_argument(fmt::format(
          "--max-restarts {} restarts from the newest checkpoint: set checkpoint.dir and leave checkpoint.resume = "
          "\"auto\" (it is \"{}\")",
          o->max_restarts, c.resume));
    }
    if (!DistEnv::from_environment().distributed()) {  // the launching process, once (not on every rank)
      const DeviceKind device = check_run(c, nproc, nproc, o->check_plan, true);
      if (!c.ckpt_dir.empty()) ckpt::check_directory(c.ckpt_dir);
      if (device == DeviceKind::Cpu) measure_host_before_ranks(c);
    }
    if (int rc = relaunch_if_needed(nproc, o->max_restarts); rc >= 0) {
      // The launcher is done: its ranks exited and their output is printed. It skips libtorch's static
      // destructors on the way out (0.15 s of unregistering operators, after every run).
      std::fflush(nullptr);
      std::_Exit(rc);
    }
    const DistEnv env = DistEnv::from_environment();
    const BackendKind backend = bind_run_device(c, env.local_rank, env.local_world_size);
    int rc = 0;
    {
      auto rt = start_runtime(c.comm_timeout, c.comm_check_every, backend);
      rc = train(c, *rt, o->check_plan);
    }  // the process groups closed, checkpoint writers joined, files closed
    // Nothing is left to run: skip libtorch's static destructors too (the launcher's reason, above).
    std::fflush(nullptr);
    std::_Exit(rc);
  };
}

}  // namespace meshtrain::cli
