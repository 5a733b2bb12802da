// Published, measured training runs the time model (plan/step_time.h) is
// checked against: each with its paper's configuration and measured figure.
// tests/test_plan_time.cpp holds the model to them; `meshtrain plan
// --validate` prints the table (bench/plan.sh writes it to docs/).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/estimate.h"

namespace meshtrain::plan {

struct PublishedRun {
  enum class Metric {
    StepSeconds,   // iteration time
    TflopsPerGpu,  // achieved teraFLOP/s per GPU, counted with Narayanan et al.'s Eq. 3
  };
  std::string source;  // paper and table
  std::string label;   // the row
  std::string model;   // plan preset
  std::string gpu;     // plan GPU preset
  Strategy strategy;
  EstimateOptions options;
  Metric metric = Metric::StepSeconds;
  double published = 0;
};

// Korthikanti et al. 2022 Table 5 (8 runs) and Narayanan et al. 2021 Table 1 (10 runs).
std::vector<PublishedRun> published_runs();

// The model's prediction in the run's metric.
double predict(const PublishedRun& run);

// Every run as a Markdown table: source, row, configuration, published, predicted, error; then the largest
// error of each source.
std::string validation_table();

// Narayanan et al. 2021 Eq. 3: FLOPs of one iteration with full recomputation,
// 96 B s l h^2 (1 + s / 6h + V / 16 l h).
double narayanan_eq3_flops(const ModelSpec& m, int64_t global_batch);

}  // namespace meshtrain::plan
