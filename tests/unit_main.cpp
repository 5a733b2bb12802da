// main() of the single-process test binaries: GoogleTest plus the ledger (ledger.h).
#include <gtest/gtest.h>

#ifdef MESHTRAIN_LOADS_CUDA  // binaries that link libtorch (test_unit)
#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/methods/builtin.h"
#endif
#include "tests/ledger.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef MESHTRAIN_LOADS_CUDA
  meshtrain::load_cuda_where_a_driver_is();  // before any ATen call (platform/cuda_loader.h)
  meshtrain::register_builtin_methods();     // train.method = dpo, reward, grpo, ppo (train/method.h)
#endif
  meshtrain::test::install_ledger();
  return RUN_ALL_TESTS();
}
