// meshtrain plot METRICS.jsonl [MORE.jsonl ...] --out curves.svg [--labels a,b] [--title TEXT]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "meshtrain/train/plot.h"

namespace meshtrain::cli {

Run add_plot(CLI::App& app) {
  struct Opts {
    std::vector<std::string> inputs;
    std::string out, labels, title = "training curves";
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("plot", "loss, validation loss, learning rate, gradient norm and tokens/s against "
                                        "step as one SVG; several runs overlaid");
  cmd->add_option("metrics", o->inputs, "the JSON lines of train.metrics, one file per run")->required();
  cmd->add_option("--out", o->out, "the SVG to write")->required();
  cmd->add_option("--labels", o->labels, "comma-separated run names (default: the file names)");
  cmd->add_option("--title", o->title, "the figure's title")->capture_default_str();
  return [o]() {
    std::vector<std::string> labels;
    std::stringstream in(o->labels);
    for (std::string l; std::getline(in, l, ',');) labels.push_back(l);
    if (!o->labels.empty() && labels.size() != o->inputs.size()) {
      throw std::invalid_argument(fmt::format("--labels has {} names for {} metrics files", labels.size(),
                                              o->inputs.size()));
    }
    std::vector<MetricsRun> runs;
    for (size_t i = 0; i < o->inputs.size(); ++i) {
      const std::string& p = o->inputs[i];
      runs.push_back(read_metrics(p, labels.empty() ? std::filesystem::path(p).filename().string() : labels[i]));
    }
    const std::string tmp = o->out + ".tmp";
    std::ofstream(tmp) << plot_svg(runs, o->title);
    std::filesystem::rename(tmp, o->out);
    fmt::print("wrote {} ({} run{})\n", o->out, runs.size(), runs.size() == 1 ? "" : "s");
    return 0;
  };
}

}  // namespace meshtrain::cli
