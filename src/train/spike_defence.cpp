#include "train/spike_defence.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace meshtrain {

SpikeDefence::SpikeDefence(const SpikeOptions& o, int64_t accumulation, uint64_t rows)
    : o_(o), accumulation_(accumulation), rows_(rows), detector_(o) {}

void SpikeDefence::begin_step(int64_t s, TokenLoader& loader) {
  verdict_ = {};
  for (;;) {
    const LoaderState at = loader.state();
    const bool gone = std::any_of(dropped_.begin(), dropped_.end(), [&](const DroppedBatch& b) {
      return b.epoch == at.epoch && b.windows == at.step * rows_;
    });
    if (!gone) {
      starts_[s] = at;
      return;
    }
    for (int64_t i = 0; i < accumulation_; ++i) loader.next();  // the dropped batch, read past unused
  }
}

UpdateGate SpikeDefence::gate() {
  if (o_.policy == SpikePolicy::Off) return {};
  return [this](double loss, double grad_norm) {
    verdict_ = detector_.observe(loss, grad_norm);
    return !verdict_.spike || o_.policy == SpikePolicy::Log;
  };
}

nlohmann::json SpikeDefence::event(int64_t s, const StepResult& r, const std::string& action) const {
  return {{"step", s},
          {"loss", r.loss},
          {"grad_norm", r.grad_norm},
          {"loss_z", verdict_.loss_z},
          {"grad_z", verdict_.grad_z},
          {"reason", verdict_.reason},
          {"policy", spike_policy_name(o_.policy)},
          {"action", action}};
}

nlohmann::json SpikeDefence::note(int64_t s, const StepResult& r, const std::string& action) {
  events_.push_back(event(s, r, action));
  return events_.back();
}

nlohmann::json SpikeDefence::roll_back(int64_t s, const StepResult& r, int64_t to) {
  if (rollbacks_ >= o_.max_rollbacks) {
    throw std::runtime_error(fmt::format("loss spike at step {} ({}) after {} rollbacks to the checkpoint of step {}: "
                                         "dropping data does not cure it; look at the numerics (meshtrain diagnose "
                                         "step), lower train.lr, or raise spike.max_rollbacks",
                                         s, verdict_.reason, rollbacks_, to));
  }
  ++rollbacks_;
  nlohmann::json e = event(s, r, "rolled back");
  e["to_step"] = to;
  std::vector<DroppedBatch> now;
  for (int64_t t = std::max(to + 1, s - o_.skip_batches + 1); t <= s; ++t) {
    const LoaderState at = starts_.at(t);
    now.push_back({at.epoch, at.step * rows_, t});
  }
  dropped_.insert(dropped_.end(), now.begin(), now.end());
  e["dropped"] = dropped_to_json(now);
  starts_.erase(starts_.upper_bound(to), starts_.end());
  events_.push_back(e);
  return e;
}

void SpikeDefence::saved(int64_t s) {
  rollbacks_ = 0;
  starts_.erase(starts_.begin(), starts_.upper_bound(s));
}

nlohmann::json SpikeDefence::state() const {
  return {{"detector", detector_.state()}, {"dropped", dropped_to_json(dropped_)}, {"events", events_}};
}

void SpikeDefence::restore(const nlohmann::json& j, bool rollback) {
  if (j.is_null()) return;
  detector_.restore(j.at("detector"));
  if (rollback) return;
  dropped_ = dropped_from_json(j.at("dropped"));
  events_ = j.at("events");
}

std::string spike_line(const nlohmann::json& e) {
  std::string out = fmt::format("loss spike ({}): loss {:.4f}, grad norm {:.4g}; {}", e.at("reason").get<std::string>(),
                                e.at("loss").get<double>(), e.at("grad_norm").get<double>(),
                                e.at("action").get<std::string>());
  if (e.contains("to_step")) {
    std::vector<std::string> steps;
    for (const auto& b : e.at("dropped")) {
      steps.push_back(fmt::format("{} (epoch {}, windows from {})", b.at("step").get<int64_t>(),
                                  b.at("epoch").get<uint64_t>(), b.at("windows").get<uint64_t>()));
    }
    out += fmt::format(" to the checkpoint of step {}, dropping the batch{} of step{} {} from the data",
                       e.at("to_step").get<int64_t>(), steps.size() == 1 ? "" : "es", steps.size() == 1 ? "" : "s",
                       fmt::join(steps, ", "));
  }
  return out;
}

}  // namespace meshtrain
