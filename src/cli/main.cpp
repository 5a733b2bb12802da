// meshtrain: one binary for every job. Errors from the library arrive here as
// exceptions and leave as one message and a non-zero status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/methods/builtin.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/platform/threads.h"

namespace {

// Edit distance (insertions, deletions, substitutions) between two words.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // ranks print through a pipe: keep lines live
  meshtrain::cli::set_argv(argc, argv);
  // Ranks started by srun/mpirun, several on a node, need OMP_WAIT_POLICY and the
  // malloc tunables before libraries load: re-exec once with them. One process
  // alone on its node sets the tunables' effect with mallopt (threads.h).
  // The launcher itself computes nothing and does not need them.
  if (argc > 1 && std::strcmp(argv[1], "launch") != 0 && std::strcmp(argv[1], "mesh") != 0 &&
      std::strcmp(argv[1], "plan") != 0 && std::strcmp(argv[1], "ckpt") != 0 && std::strcmp(argv[1], "matrix") != 0) {
    try {
      meshtrain::reexec_with_rank_environment(argv, meshtrain::DistEnv::from_environment().local_world_size);
    } catch (const std::exception&) {
      // a broken environment is reported by the command itself
    }
  }
  meshtrain::load_cuda_where_a_driver_is();  // before any ATen call (platform/cuda_loader.h)
  meshtrain::register_builtin_methods();     // train.method = dpo, reward, grpo, ppo (train/method.h)
  CLI::App app{"meshtrain: distributed LLM training in C++ (launch, train, sample, ckpt, tokenize, plan, mesh, matrix, bench, lab)"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, meshtrain::cli::Run>> commands;
  auto add = [&](auto adder) {
    size_t before = app.get_subcommands({}).size();
    auto run = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], run);
  };
  add(meshtrain::cli::add_launch);
  add(meshtrain::cli::add_data);
  add(meshtrain::cli::add_mesh);
  add(meshtrain::cli::add_matrix);
  add(meshtrain::cli::add_bench);
  add(meshtrain::cli::add_lab);
  add(meshtrain::cli::add_plan);
  add(meshtrain::cli::add_plot);
  add(meshtrain::cli::add_tokenize);
  add(meshtrain::cli::add_train);
  add(meshtrain::cli::add_sample);
  add(meshtrain::cli::add_eval);
  add(meshtrain::cli::add_ckpt);
  add(meshtrain::cli::add_diagnose);
  // A word that is no command, at any level that requires one (`meshtrain ckpt verfy`): name it and the
  // nearest command there (CLI11 would only say that a subcommand is required).
  const CLI::App* level = &app;
  std::string path = "meshtrain";
  for (int i = 1; i < argc && argv[i][0] != '-' && level->get_require_subcommand_min() > 0; ++i) {
    std::vector<std::string> names;
    for (const CLI::App* sub : level->get_subcommands({})) names.push_back(sub->get_name());
    const std::string word = argv[i];
    const auto found = std::find(names.begin(), names.end(), word);
    if (found != names.end()) {
      level = level->get_subcommands({})[static_cast<size_t>(found - names.begin())];
      path += " " + word;
      continue;
    }
    const std::string nearest = *std::min_element(names.begin(), names.end(), [&](const auto& x, const auto& y) {
      return edit_distance(word, x) < edit_distance(word, y);
    });
    fmt::print(stderr, "meshtrain: error: unknown command '{}'{}; the commands{} are: {} ({} --help)\n", word,
               edit_distance(word, nearest) <= 2 ? fmt::format(", did you mean '{}'?", nearest) : "",
               path == "meshtrain" ? "" : " of '" + path + "'", fmt::join(names, ", "), path);
    return 2;
  }
  // `meshtrain launch [OPTIONS] -- PROGRAM ARGS`: CLI11 would take the "--" as the end of every command's
  // options and refuse the program's words; drop it (only the one that ends the launcher's own options).
  std::vector<char*> args(argv, argv + argc);
  if (argc > 2 && std::strcmp(argv[1], "launch") == 0) {
    for (size_t i = 2; i < args.size(); ++i) {
      const std::string a = args[i];
      if (a == "--") {
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      if (a.empty() || a[0] != '-') break;           // the program: "--" belongs to it
      if (a.find('=') == std::string::npos) ++i;      // every launcher option takes a value
    }
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
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
