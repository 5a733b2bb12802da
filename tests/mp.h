// Shared state of the multi-process test binary: one Runtime per rank, set up by
// mp_main.cpp from the launcher's environment before any test runs.
#pragma once

#include "meshtrain/runtime/runtime.h"

namespace meshtrain::test {

Runtime& runtime();

}  // namespace meshtrain::test
