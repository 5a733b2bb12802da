// Loss-spike defence: an online detector on the global loss and gradient norm
// of each step, and what the run does about a spike (seed 003, "Loss spike
// troubleshooting"; PaLM, Chowdhery et al. 2022, §5.1: "restart training from a
// checkpoint roughly 100 steps before the spike started, and skip roughly
// 200–500 data batches").
//
// The detector keeps the last `window` accepted values of each signal and
// scores a new value x by the robust z-score (Iglewicz & Hoaglin 1993):
//
//   z = (x - median) / max(1.4826 * MAD, 1e-3 * |median|)
//
// MAD = the median of |x_i - median|; 1.4826 * MAD estimates the standard
// deviation of normal data, but a few outliers in the window move neither the
// median nor the MAD (a mean and standard deviation would follow the spike).
// The floor keeps a flat window (MAD = 0) from calling any rise a spike.
// Only rises count (a falling loss is no trouble). A step is a spike when
// either z exceeds its threshold, or when the loss or the norm is not finite;
// before `warmup` values are known only non-finite values are. A spike is
// never added to the window, so the detector stays as sensitive after it.
//
// Every rank sees the same global loss and norm (both are all-reduced) and
// holds the same detector, so every rank reaches the same verdict with no
// extra collective.
//
// Policies (config [spike] policy): "off"; "log" (report, train on); "skip"
// (drop the step's update: the optimizer's moments and step count, and so the
// learning rate, stay as they were; the batch is spent); "rollback" (drop the
// update, reload the newest checkpoint, and drop the `skip_batches` global
// batches ending with the spike's — those read since the checkpoint — from
// the data, then train on: the run continues as if its data never held them).
// Events and dropped batches go to the metrics file and the checkpoint.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace meshtrain {

enum class SpikePolicy { Off, Log, Skip, Rollback };
SpikePolicy parse_spike_policy(const std::string& s);  // std::invalid_argument naming the value
const char* spike_policy_name(SpikePolicy p);

struct SpikeOptions {
  SpikePolicy policy = SpikePolicy::Log;
  int64_t window = 50;   // accepted steps the median and MAD are taken over
  int64_t warmup = 20;   // accepted steps before a finite value can be a spike
  double loss_z = 6;     // thresholds on the robust z-scores
  double grad_z = 6;
  int64_t skip_batches = 1;   // rollback: global batches dropped, ending with the spike's
  int64_t max_rollbacks = 3;  // rollbacks to one checkpoint before the run stops
};

// The robust z-score of x against `values` (see above); 0 for no values.
double robust_z(const std::deque<double>& values, double x);

struct SpikeVerdict {
  bool spike = false;
  double loss_z = 0, grad_z = 0;
  std::string reason;  // "loss z 35.1 > 6", "grad norm is nan", ...
};

class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeOptions o) : o_(o) {}
  // Scores a step; remembers the values when they are not a spike.
  SpikeVerdict observe(double loss, double grad_norm);
  // The windows, for checkpoints: {"loss": [...], "grad_norm": [...]}.
  nlohmann::json state() const;
  // Throws std::runtime_error naming a malformed field.
  void restore(const nlohmann::json& j);
  const SpikeOptions& options() const { return o_; }

 private:
  SpikeOptions o_;
  std::deque<double> loss_, grad_;
};

// A global batch dropped from the data: where the loader stood when it began
// (its epoch, and the windows of the epoch read before it: as a checkpoint's
// loader field, whatever the data-parallel size) and the step that read it.
struct DroppedBatch {
  uint64_t epoch = 0, windows = 0;
  int64_t step = 0;
};
nlohmann::json dropped_to_json(const std::vector<DroppedBatch>& d);
std::vector<DroppedBatch> dropped_from_json(const nlohmann::json& j);

}  // namespace meshtrain
