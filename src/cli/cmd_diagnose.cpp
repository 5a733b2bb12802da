// meshtrain diagnose hang DIR: the report of the ranks' flight records
// (comm/hang_report.h) that the launcher printed when the job failed.
// meshtrain diagnose step CKPT --step N: one step replayed from a checkpoint,
// layer by layer (train/diagnose.h).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "meshtrain/comm/hang_report.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/diagnose.h"

namespace meshtrain::cli {

Run add_diagnose(CLI::App& app) {
  struct Opts {
    std::string dir;
    int world = 0;
    std::string checkpoint;
    int64_t step = 0;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("diagnose", "explain a failed or stuck job from what its ranks recorded");
  cmd->require_subcommand(1);
  auto hang = cmd->add_subcommand("hang", "which rank is behind, at which call, and where the ranks' calls diverge");
  hang->add_option("dir", o->dir, "the flight records' directory (the launcher prints it)")->required();
  hang->add_option("--world", o->world, "ranks in the job (default: the highest recorded rank + 1)");
  auto step = cmd->add_subcommand("step", "replay one step from a checkpoint: per-layer activation, gradient and "
                                          "update norms, the first non-finite tensor, the batch's statistics, and "
                                          "whether two replays agree bitwise");
  step->add_option("checkpoint", o->checkpoint, "a step directory (or a checkpoint directory: its newest)")->required();
  step->add_option("--step", o->step, "the step to replay (after the checkpoint's)")->required();
  return [o, hang, step]() {
    if (step->parsed()) {
      if (!std::filesystem::exists(o->checkpoint)) {
        throw std::invalid_argument(fmt::format("{} does not exist; pass a checkpoint's step directory", o->checkpoint));
      }
      auto rt = start_runtime(300);
      fmt::print("{}", diagnosis_text(diagnose_step(o->checkpoint, o->step, *rt)));
      return 0;
    }
    if (!hang->parsed()) return 0;
    if (!std::filesystem::is_directory(o->dir)) {
      throw std::invalid_argument(fmt::format("{} is not a directory; pass the flight records' directory the "
                                              "launcher printed (MESHTRAIN_FLIGHT_DIR)", o->dir));
    }
    std::vector<std::string> problems;
    const auto records = read_flight_records(o->dir, &problems);
    for (const auto& p : problems) fmt::print(stderr, "meshtrain diagnose: skipped {}\n", p);
    if (records.empty()) {
      throw std::invalid_argument(fmt::format("{} holds no flight records (rank_*.json)", o->dir));
    }
    int world = o->world;
    for (const auto& r : records) world = std::max(world, r.rank + 1);
    fmt::print("{}", hang_report(records, world).text);
    return 0;
  };
}

}  // namespace meshtrain::cli
