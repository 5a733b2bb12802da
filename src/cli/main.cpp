// meshtrain: one binary for every job. Errors from the library arrive here as
// exceptions and leave as one message and a non-zero status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <iostream>

#include "cli/commands.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/threads.h"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // ranks print through a pipe: keep lines live
  meshtrain::cli::set_argv(argc, argv);
  // Ranks started by srun/mpirun (or a plain start) need OMP_WAIT_POLICY and the
  // malloc tunables before libraries load: re-exec once with them (threads.h).
  // The launcher itself computes nothing and does not need them.
  if (argc > 1 && std::strcmp(argv[1], "launch") != 0 && std::strcmp(argv[1], "mesh") != 0 &&
      std::strcmp(argv[1], "plan") != 0 && std::strcmp(argv[1], "ckpt") != 0) {
    try {
      meshtrain::reexec_with_rank_environment(argv, meshtrain::DistEnv::from_environment().local_world_size);
    } catch (const std::exception&) {
      // a broken environment is reported by the command itself
    }
  }
  CLI::App app{"meshtrain: distributed LLM training in C++ (launch, train, sample, ckpt, tokenize, plan, mesh, bench, lab)"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, meshtrain::cli::Run>> commands;
  auto add = [&](auto adder) {
    size_t before = app.get_subcommands({}).size();
    auto run = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], run);
  };
  add(meshtrain::cli::add_launch);
  add(meshtrain::cli::add_mesh);
  add(meshtrain::cli::add_bench);
  add(meshtrain::cli::add_lab);
  add(meshtrain::cli::add_plan);
  add(meshtrain::cli::add_tokenize);
  add(meshtrain::cli::add_train);
  add(meshtrain::cli::add_sample);
  add(meshtrain::cli::add_eval);
  add(meshtrain::cli::add_ckpt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshtrain: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
