// `meshtrain plot`: training curves as one self-contained SVG (no plotting
// library, no script): loss with validation loss, learning rate, gradient norm
// and throughput against step, each in its own panel, several runs overlaid in
// their own colours (to compare meshes or settings). Input: the JSON lines a
// run writes to train.metrics.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace meshtrain {

struct MetricsRun {
  std::string label;
  std::vector<std::map<std::string, double>> rows;  // numeric fields of each line that has a "step"
};

// Reads one metrics file; throws std::invalid_argument naming file:line for a line that is not a JSON object,
// and the file when it has no line with a "step".
MetricsRun read_metrics(const std::string& path, const std::string& label);

// The SVG: panels "loss" (loss, and val_loss dashed), "learning rate" (lr), "gradient norm" (grad_norm),
// "tokens/s" (tokens_per_s); a panel whose keys no run has is left out.
std::string plot_svg(const std::vector<MetricsRun>& runs, const std::string& title);

// Round tick values covering [lo, hi] (about `count` of them: steps of 1, 2 or 5 x 10^k).
std::vector<double> nice_ticks(double lo, double hi, int count = 5);

}  // namespace meshtrain
