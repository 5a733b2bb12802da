// The frameworks meshtrain is checked against (tests/test_peers.cpp, tests/test_peer_training.cpp)
// live in the torch environment's python (scripts/peers_env.sh installs them, pinned): a missing
// peer fails the test that needs it, it does not skip it.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace meshtrain::test {

// Fails the calling test unless MESHTRAIN_REFERENCE_PYTHON imports `module`.
inline void require_peer(const std::string& module) {
  const auto r = run_command(std::string(MESHTRAIN_REFERENCE_PYTHON) + " -c 'import " + module + "'");
  ASSERT_EQ(r.code, 0) << MESHTRAIN_REFERENCE_PYTHON << " cannot import " << module
                       << ": run scripts/peers_env.sh (scripts/setup.sh does)\n" << r.output;
}

// `python SCRIPT` for a peer script beside tests/peers/transformers_peer.py.
inline std::string peer_script(const std::string& script) {
  return std::string(MESHTRAIN_REFERENCE_PYTHON) + " " + MESHTRAIN_SOURCE_DIR + "/tests/peers/" + script;
}

}  // namespace meshtrain::test
