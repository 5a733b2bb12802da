#include "meshtrain/train/pipeline_prediction.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "meshtrain/plan/partition.h"
#include "meshtrain/plan/schedule.h"
#include "meshtrain/plan/strategy.h"
#include "meshtrain/train/config.h"

namespace meshtrain {
namespace {

PipelinePrediction predict(const TrainConfig& c, int micro_batches, plan::Balance balance) {
  const auto stages = plan::partition_layers(c.model, c.pp * c.virtual_stages, c.pp_layers, balance);
  PipelinePrediction out;
  int64_t heaviest = 1;
  for (const auto& s : stages) heaviest = std::max(heaviest, s.work);
  plan::ActionCosts costs;
  for (const auto& s : stages) {
    out.layers.push_back(s.last - s.first);
    out.work.push_back(static_cast<double>(s.work) / static_cast<double>(heaviest));
  }
  costs.stage_scale = out.work;
  const auto schedule = plan::build_schedule(plan::parse_schedule(c.schedule), c.pp, micro_batches, c.virtual_stages);
  out.bubble = plan::simulate(schedule, costs).idle_fraction(0);
  return out;
}

std::string fractions(const std::vector<double>& v) {
  std::vector<std::string> s;
  for (double x : v) s.push_back(fmt::format("{:.2f}", x));
  return fmt::format("{}", fmt::join(s, ", "));
}

}  // namespace

PipelinePrediction predict_pipeline(const TrainConfig& c, int micro_batches) {
  return predict(c, micro_batches, c.pp_balance);
}

std::string compute_balance_note(const TrainConfig& c, int micro_batches, const PipelinePrediction& own) {
  // Interleaved chunks keep the parameter balance (the config refuses the others).
  if (!c.pp_layers.empty() || c.pp_balance == plan::Balance::Compute || c.virtual_stages > 1) return "";
  const PipelinePrediction alt = predict(c, micro_batches, plan::Balance::Compute);
  if (alt.bubble > own.bubble - 0.05) return "";
  return fmt::format("the stages' matmul work per token is [{}] of the heaviest stage's, which sets the pace; "
                     "parallel.pp_balance = \"compute\" cuts [{}] (work [{}]) for a predicted bubble of {:.1f}% "
                     "instead of {:.1f}%, with more weights and in-flight activations on the first stages",
                     fractions(own.work), fmt::join(alt.layers, ", "), fractions(alt.work), 100 * alt.bubble,
                     100 * own.bubble);
}

}  // namespace meshtrain
