#include "meshtrain/train/progress.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace meshtrain {

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

std::string progress_text(double elapsed_s, int64_t done, int64_t step, int64_t total) {
  const double per_step = done > 0 ? elapsed_s / static_cast<double>(done) : 0;
  return fmt::format("elapsed {} | eta {}", duration_text(elapsed_s),
                     duration_text(per_step * static_cast<double>(std::max<int64_t>(total - step, 0))));
}

}  // namespace meshtrain
