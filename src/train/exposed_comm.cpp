#include "meshtrain/train/exposed_comm.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "meshtrain/plan/estimate.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/run_strategy.h"

namespace meshtrain {

std::string exposed_comm_text(const std::map<std::string, double>& exposed_s, double step_s,
                              const std::map<std::string, double>& planned_s) {
  std::string parts;
  for (const auto& [axis, s] : exposed_s) {
    if (s <= 0) continue;
    const auto plan = planned_s.find(axis);
    parts += fmt::format("{}{} {:.3f} s ({:.1f}%{})", parts.empty() ? "" : ", ", axis, s,
                         step_s > 0 ? 100 * s / step_s : 0.0,
                         plan == planned_s.end() ? "" : fmt::format("; plan {:.3f} s", plan->second));
  }
  if (parts.empty()) return "";
  return fmt::format("exposed communication: {} of the step's {:.3f} s", parts, step_s);
}

std::optional<plan::GpuSpec> run_device_spec(bool cuda, const std::string& device_name, double host_gemm_flops,
                                             double host_copy_bw, int ranks_per_host) {
  if (!cuda) {
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    return plan::cpu_device(host_gemm_flops, host_copy_bw, ram, std::max(1, ranks_per_host));
  }
  std::string lower = device_name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  // The longest preset name the device's contains ("a100-40g" before "a100"); cpu is not a CUDA device.
  std::string best;
  for (const std::string& name : plan::gpu_preset_names()) {
    if (name != "cpu" && lower.find(name) != std::string::npos && name.size() > best.size()) best = name;
  }
  if (best.empty()) return std::nullopt;
  return plan::gpu_preset(best);
}

std::map<std::string, double> planned_exposed(const TrainConfig& c, int dp, const plan::GpuSpec& device) {
  const plan::StepEstimate e = plan::estimate_step(c.model, strategy_of(c, dp), device);
  std::map<std::string, double> out;
  for (const auto& [axis, t] : e.traffic) {
    if (t.bytes > 0 || t.exposed > 0) out[axis] = t.exposed;
  }
  return out;
}

}  // namespace meshtrain
