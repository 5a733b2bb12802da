// Published, measured training runs the time model (plan/step_time.h) is
// checked against: each with its source's configuration and measured figure.
//
// Two halves (issue #46), fixed on 2026-12-06 before any change to the model:
//   fitting   Korthikanti et al.'s Table 5 and Narayanan et al.'s Table 1 (they
//             shaped the model's switches: they cannot also validate it), and
//             every even-numbered row (0, 2, ...) of the newer list below;
//   held out  its odd-numbered rows. The model may be shaped on the fitting half
//             only: the held-out rows are unreadable inside a FittingScope
//             (tests/test_plan_time.cpp holds the model to the fitting half
//             inside one), and are reported, never fitted.
// The newer list, in its order: NeMo 24.07's DGX-H100 FP8 table, Megatron-Bridge
// 25.11's DGX-H100 and DGX-B200 FP8 tables, its 26.02 DGX-H100 FP8 table,
// torchtitan's December 2024 H100 benchmarks, and Llama 3's Table 4. NeMo 24.07's
// fine-tuning rows (post_training_runs(), below) are held out whole. One constant is
// fitted, on the fitting half only: the clock of torchtitan's 500 W H100s within the
// interval its source gives (fit_clock_scale, below; 2026-12-07).
// `meshtrain plan validate` prints both halves (bench/plan.sh writes it to docs/).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/estimate.h"
#include "meshtrain/plan/posttrain_search.h"

namespace meshtrain::plan {

struct PublishedRun {
  enum class Metric {
    StepSeconds,          // iteration time
    TflopsPerGpu,         // achieved teraFLOP/s per GPU, counted with Narayanan et al.'s Eq. 3
    TokensPerSecondPerGpu,
    ModelTflopsPerGpu,    // model teraFLOP/s per GPU, counted as plan/count.h does (the whole attention square)
  };
  enum class Half { Fitting, HeldOut };
  std::string source;  // paper and table, or document and release
  std::string label;   // the row
  std::string model;   // plan preset
  std::string gpu;     // plan GPU preset
  std::string notes;   // the source's hardware and software where they differ from the preset, what it leaves unstated
  Strategy strategy;
  EstimateOptions options;
  Metric metric = Metric::StepSeconds;
  double published = 0;
  Half half = Half::Fitting;
  // Layout fields the source does not give: predict() searches them and takes the fastest setting that fits the
  // device's memory (the published runs were tuned; the planner asked the same question searches too), or, where
  // none fits by the ledger, the fastest valid one, flagged. A stated interleaved schedule with vpp unstated
  // searches V > 1 only.
  struct Unstated {
    bool zero = false, recompute = false, micro_batch = false, vpp = false;
  } unstated;
  double memory_bytes = 0, memory_bw = 0;  // the source's device, where it differs from the preset (0: the preset's)
  // The source's tensor-core clock against the preset's (a power-capped part): scales its 16-bit and FP8 peaks and
  // its flash-attention rates, all bound by the tensor cores' clock. 1: the preset's.
  double clock_scale = 1;
};

// The clock scale within [lo, hi] (steps of 0.001) that minimises the largest |error| over `rows`, all of them of
// one source's fitting half: the one constant validation fits (torchtitan's power-capped H100s, whose peak the
// source puts "between SXM and NVL"; validation.cpp). Throws std::invalid_argument for an empty list or a held-out
// row.
double fit_clock_scale(const std::vector<PublishedRun>& rows, double lo, double hi);

// While one is alive (on this thread), reading a held-out row throws std::logic_error: the fitting code path
// (anything that shapes or holds the model to published rows) runs inside one.
class FittingScope {
 public:
  FittingScope();
  ~FittingScope();
  FittingScope(const FittingScope&) = delete;
  FittingScope& operator=(const FittingScope&) = delete;
};

std::vector<PublishedRun> fitting_runs();
std::vector<PublishedRun> held_out_runs();  // throws std::logic_error inside a FittingScope
std::vector<PublishedRun> published_runs();  // both halves, fitting first (throws inside a FittingScope)

// Published fine-tuning runs (NeMo 24.07's SFT and LoRA table), predicted by the post-training search
// (plan/posttrain_search.h) with the source's layout fixed and what it leaves unstated searched. The
// post-training time model was built from pretraining's before these rows were read: all of them are held out.
struct PublishedPostTrainRun {
  std::string source, label;
  PostTrainInput input;  // method, model, device, GPUs, sequence, batch and the fixed layout
  double tokens_per_s_per_gpu = 0;
};
std::vector<PublishedPostTrainRun> post_training_runs();  // throws std::logic_error inside a FittingScope
struct PostTrainPrediction {
  double tokens_per_s_per_gpu = 0;
  Strategy strategy;
  bool fits = false;
};
PostTrainPrediction predict_post_training(const PublishedPostTrainRun& run);
// The rows as a Markdown table with their errors, and the median and largest |error|.
std::string post_training_table();

// The model's prediction in the run's metric, and the layout it predicted (unstated fields searched).
struct Prediction {
  double value = 0;
  Strategy strategy;
  bool fits = true;  // some setting of the unstated fields fits the device's memory (else the fastest valid one)
};
Prediction predict_run(const PublishedRun& run);
double predict(const PublishedRun& run);

// Every run as a Markdown table, one per half: source, row, configuration predicted, published, predicted,
// error; then per half the median and largest |error| and per source the largest.
std::string validation_table();

// Narayanan et al. 2021 Eq. 3: FLOPs of one iteration with full recomputation,
// 96 B s l h^2 (1 + s / 6h + V / 16 l h).
double narayanan_eq3_flops(const ModelSpec& m, int64_t global_batch);

}  // namespace meshtrain::plan
