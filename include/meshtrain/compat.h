// Every difference between libtorch 1.13 (Debian, CPU) and libtorch >= 2.4 (CUDA
// wheels) that meshtrain touches lives here, and only here.
#pragma once

#include <torch/csrc/api/include/torch/version.h>

#define MESHTRAIN_TORCH_2 (TORCH_VERSION_MAJOR >= 2)

namespace c10d {
#if MESHTRAIN_TORCH_2
// >= 2.0: ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend and are
// called directly (same method names as 1.13's ProcessGroup).
class Backend;
#else
class ProcessGroup;
#endif
class Store;
}  // namespace c10d

namespace meshtrain {

#if MESHTRAIN_TORCH_2
using PGBackend = c10d::Backend;
#else
using PGBackend = c10d::ProcessGroup;
#endif

// Which collective library a group runs on; decides which gaps Comm fills itself.
enum class BackendKind { Gloo, Nccl };

// Gloo in libtorch < 2.2 lacks bf16 collectives, AVG, _allgather_base and
// reduce_scatter (PLATFORM.md); from 2.2 it has the first three.
constexpr bool kGlooHasBf16 = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2);

}  // namespace meshtrain
