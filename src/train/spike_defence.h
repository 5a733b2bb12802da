// The training loop's side of the loss-spike defence (train/spike.h): the
// detector, where each step's batch began in the data, the batches rollbacks
// dropped and every event, all of which the checkpoint carries ("spike").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/loader.h"
#include "meshtrain/train/spike.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

class SpikeDefence {
 public:
  // `accumulation`: loader steps per global batch; `rows`: rows one loader
  // step reads over all data-parallel ranks (micro_batch x dp).
  SpikeDefence(const SpikeOptions& o, int64_t accumulation, uint64_t rows);

  // Before step s reads its batch: reads past the batches rollbacks dropped,
  // then remembers where s's batch begins.
  void begin_step(int64_t s, TokenLoader& loader);
  // The step's update gate: judges the loss and norm; under skip and rollback
  // a spike's update is dropped. Empty when the policy is off.
  UpdateGate gate();
  // After the step: whether it was a spike.
  bool spiked() const { return verdict_.spike; }
  // Rollback: the checkpoint to go back to is step `to` (< s); the batches to
  // drop are the last skip_batches up to s, those read after `to`. Records and
  // returns the event. Throws std::runtime_error (every rank alike) when this
  // checkpoint was rolled back to max_rollbacks times already.
  nlohmann::json roll_back(int64_t s, const StepResult& r, int64_t to);
  // A spike that is not rolled back: records and returns the event; `action`
  // says what happened to the update.
  nlohmann::json note(int64_t s, const StepResult& r, const std::string& action);
  // A checkpoint was saved at step s: later rollbacks go there.
  void saved(int64_t s);

  // For the checkpoint: {"detector", "dropped", "events"}.
  nlohmann::json state() const;
  // From a checkpoint's "spike" (absent in older checkpoints: nothing).
  // `rollback`: only the detector; the dropped batches and events of this
  // run, newer than the checkpoint, are kept.
  void restore(const nlohmann::json& j, bool rollback);

 private:
  nlohmann::json event(int64_t s, const StepResult& r, const std::string& action) const;
  SpikeOptions o_;
  int64_t accumulation_;
  uint64_t rows_;
  SpikeDetector detector_;
  SpikeVerdict verdict_;
  std::map<int64_t, LoaderState> starts_;  // where each step's batch began, since the last checkpoint
  std::vector<DroppedBatch> dropped_;
  nlohmann::json events_ = nlohmann::json::array();
  int64_t rollbacks_ = 0;  // to the newest checkpoint
};

// "loss spike at step 23 (loss z 35.1 > 6): loss 4.6052, grad norm 12.345; <action>"
std::string spike_line(const nlohmann::json& event);

}  // namespace meshtrain
