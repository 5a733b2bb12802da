// Numerical faults injected on purpose, for the tests of the diagnosis tools
// (train/diagnose.h, train/replica_check.h), as crash points (crash_point.h)
// are for the save protocol:
//
//   MESHTRAIN_FAULT="nan layer=<L> step=<S> [rank=<R>]"
//       block L's output holds a NaN in every training forward of step S
//       (a kernel or a device that computes garbage);
//   MESHTRAIN_FAULT="perturb step=<S> [rank=<R>]"
//       after step S's update one weight of the first parameter moves by 1e-3
//       (silent data corruption in one replica);
//
// on rank R only (by the RANK variable), default every rank. The trainer and
// the step replay say which step runs (set_fault_step). Unset, a check costs
// one comparison; a malformed value is std::invalid_argument naming it.
#pragma once

#include <cstdint>

namespace meshtrain {

// The training step now running (0: none).
void set_fault_step(int64_t step);
// Whether block `layer`'s output gets a NaN now.
bool fault_nan_in_layer(int64_t layer);
// Whether this rank's weights get perturbed after step `step`'s update.
bool fault_perturb_after(int64_t step);

}  // namespace meshtrain
