// Where a ZeRO rank's slices sit in the model (parallel/data/zero.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain {

// Elements [begin, end) of model parameter `param` (its local tensor flattened
// row-major) are elements [at, at + end - begin) of this rank's slice of flat
// `flat` (and of any per-flat state, such as AdamW's moments).
struct OwnedRange {
  size_t flat = 0, param = 0;
  int64_t begin = 0, end = 0, at = 0;
};

}  // namespace meshtrain
