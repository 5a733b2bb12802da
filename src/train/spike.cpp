#include "meshtrain/train/spike.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace meshtrain {

SpikePolicy parse_spike_policy(const std::string& s) {
  if (s == "off") return SpikePolicy::Off;
  if (s == "log") return SpikePolicy::Log;
  if (s == "skip") return SpikePolicy::Skip;
  if (s == "rollback") return SpikePolicy::Rollback;
  throw std::invalid_argument(fmt::format("unknown spike policy \"{}\": use off, log, skip or rollback", s));
}

const char* spike_policy_name(SpikePolicy p) {
  switch (p) {
    case SpikePolicy::Off: return "off";
    case SpikePolicy::Log: return "log";
    case SpikePolicy::Skip: return "skip";
    case SpikePolicy::Rollback: return "rollback";
  }
  return "?";
}

namespace {

double median(std::vector<double> v) {
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)) + hi) / 2;
}

void remember(std::deque<double>& window, double x, int64_t size) {
  window.push_back(x);
  while (static_cast<int64_t>(window.size()) > size) window.pop_front();
}

std::deque<double> numbers(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array()) {
    throw std::runtime_error(fmt::format("spike detector state: \"{}\" must be a list of numbers", key));
  }
  std::deque<double> out;
  for (const auto& v : j[key]) {
    if (!v.is_number()) throw std::runtime_error(fmt::format("spike detector state: \"{}\" holds {}", key, v.dump()));
    out.push_back(v.get<double>());
  }
  return out;
}

}  // namespace

double robust_z(const std::deque<double>& values, double x) {
  if (values.empty()) return 0;
  const std::vector<double> v(values.begin(), values.end());
  const double m = median(v);
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double y : v) dev.push_back(std::fabs(y - m));
  const double scale = std::max(1.4826 * median(dev), 1e-3 * std::fabs(m));
  return scale > 0 ? (x - m) / scale : 0;
}

SpikeVerdict SpikeDetector::observe(double loss, double grad_norm) {
  SpikeVerdict v;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    v.spike = true;
    v.reason = !std::isfinite(loss) ? fmt::format("loss is {}", loss) : fmt::format("grad norm is {}", grad_norm);
    return v;
  }
  const bool armed = static_cast<int64_t>(loss_.size()) >= o_.warmup;
  v.loss_z = robust_z(loss_, loss);
  v.grad_z = robust_z(grad_, grad_norm);
  if (armed && v.loss_z > o_.loss_z) {
    v.spike = true;
    v.reason = fmt::format("loss z {:.1f} > {:g}", v.loss_z, o_.loss_z);
  }
  if (armed && v.grad_z > o_.grad_z) {
    v.spike = true;
    v.reason += fmt::format("{}grad norm z {:.1f} > {:g}", v.reason.empty() ? "" : ", ", v.grad_z, o_.grad_z);
  }
  if (!v.spike) {
    remember(loss_, loss, o_.window);
    remember(grad_, grad_norm, o_.window);
  }
  return v;
}

nlohmann::json SpikeDetector::state() const {
  return {{"loss", std::vector<double>(loss_.begin(), loss_.end())},
          {"grad_norm", std::vector<double>(grad_.begin(), grad_.end())}};
}

void SpikeDetector::restore(const nlohmann::json& j) {
  std::deque<double> l = numbers(j, "loss"), g = numbers(j, "grad_norm");
  if (l.size() != g.size()) {
    throw std::runtime_error(fmt::format("spike detector state: {} losses but {} grad norms", l.size(), g.size()));
  }
  // A window saved under a larger spike.window keeps its newest values.
  while (static_cast<int64_t>(l.size()) > o_.window) {
    l.pop_front();
    g.pop_front();
  }
  loss_ = std::move(l);
  grad_ = std::move(g);
}

nlohmann::json dropped_to_json(const std::vector<DroppedBatch>& d) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& b : d) out.push_back({{"epoch", b.epoch}, {"windows", b.windows}, {"step", b.step}});
  return out;
}

std::vector<DroppedBatch> dropped_from_json(const nlohmann::json& j) {
  std::vector<DroppedBatch> out;
  if (!j.is_array()) throw std::runtime_error("spike.dropped must be a list of {epoch, windows, step}");
  for (const auto& b : j) {
    try {
      out.push_back({b.at("epoch").get<uint64_t>(), b.at("windows").get<uint64_t>(), b.at("step").get<int64_t>()});
    } catch (const nlohmann::json::exception&) {
      throw std::runtime_error(fmt::format("spike.dropped: {} is not {{epoch, windows, step}}", b.dump()));
    }
  }
  return out;
}

}  // namespace meshtrain
