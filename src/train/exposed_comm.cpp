#include "meshtrain/train/exposed_comm.h"

#include <fmt/format.h>

namespace meshtrain {

std::string exposed_comm_text(const std::map<std::string, double>& exposed_s, double step_s) {
  std::string parts;
  for (const auto& [axis, s] : exposed_s) {
    if (s <= 0) continue;
    parts += fmt::format("{}{} {:.3f} s ({:.1f}%)", parts.empty() ? "" : ", ", axis, s,
                         step_s > 0 ? 100 * s / step_s : 0.0);
  }
  if (parts.empty()) return "";
  return fmt::format("exposed communication: {} of the step's {:.3f} s", parts, step_s);
}

}  // namespace meshtrain
