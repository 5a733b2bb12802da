// The test ledger: what every GoogleTest binary ran, skipped (with the reason)
// or left out by its filter, written to $MESHTRAIN_TEST_LEDGER when that is
// set (CTest sets it per entry, tests/CMakeLists.txt). tests/check_skips.py
// reads every entry's ledger after the run and fails when a test ran nowhere:
// a test may skip in one entry (the dp2 x tp2 test on 3 ranks) but not in all,
// unless tests/allowed_skips.txt names it with a reason.
#pragma once

namespace meshtrain::test {

// Appends the ledger listener to GoogleTest's listeners. Call after
// InitGoogleTest; `write` false on the ranks that should not write (all but rank 0).
void install_ledger(bool write = true);

}  // namespace meshtrain::test
