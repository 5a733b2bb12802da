// Where this build put the programs and scripts the tests run. The values live in
// one file the build generates (tests/CMakeLists.txt: test_paths.cpp), not on
// every test's compile line: absolute paths there would keep ccache from reusing
// the test objects in another clone of the repository (scripts/ccache_launcher.sh).
#pragma once

namespace meshtrain::test_paths {
extern const char kBin[];              // build/meshtrain
extern const char kReferencePython[];  // a python3 that imports torch (the float64 reference, the peers)
extern const char kReferenceScript[];  // tests/reference/reference_model.py
extern const char kPeersScript[];      // tests/peers/transformers_peer.py
extern const char kCommMpBin[];        // build/tests/test_comm_mp
extern const char kToyMethodBin[];     // build/tests/test_toy_method
extern const char kSourceDir[];        // the checkout
}  // namespace meshtrain::test_paths

#define MESHTRAIN_BIN ::meshtrain::test_paths::kBin
#define MESHTRAIN_REFERENCE_PYTHON ::meshtrain::test_paths::kReferencePython
#define MESHTRAIN_REFERENCE_SCRIPT ::meshtrain::test_paths::kReferenceScript
#define MESHTRAIN_PEERS_SCRIPT ::meshtrain::test_paths::kPeersScript
#define MESHTRAIN_COMM_MP_BIN ::meshtrain::test_paths::kCommMpBin
#define MESHTRAIN_TOY_METHOD_BIN ::meshtrain::test_paths::kToyMethodBin
#define MESHTRAIN_SOURCE_DIR ::meshtrain::test_paths::kSourceDir
