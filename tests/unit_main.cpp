// main() of the single-process test binaries: GoogleTest plus the ledger (ledger.h).
#include <gtest/gtest.h>

#include "tests/ledger.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshtrain::test::install_ledger();
  return RUN_ALL_TESTS();
}
