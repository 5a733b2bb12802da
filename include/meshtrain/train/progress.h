// The step log's progress: time since this process's first step and the
// estimated time to the run's last step (the mean step so far times the steps
// left; validation and checkpoint time included in the mean).
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain {

// "45s", "3m04s", "2h05m", "3d04h".
std::string duration_text(double seconds);
// "elapsed 3m04s | eta 1h02m": `done` steps took `elapsed_s`; the run is at `step` of `total`.
std::string progress_text(double elapsed_s, int64_t done, int64_t step, int64_t total);

}  // namespace meshtrain
