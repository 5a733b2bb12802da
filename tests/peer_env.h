// The frameworks meshtrain is checked against (tests/test_peers.cpp, tests/test_peer_training.cpp)
// live in the torch environment's python (scripts/peers_env.sh installs them, pinned): a missing
// peer fails the test that needs it, it does not skip it.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

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

// A Llama (4 query heads on 2 kv heads, untied, no dropout, vocabulary 400) trained `steps` steps
// at lr 1e-2 on the corpus tiny_tokenizer(d) wrote, checkpointed in `ck` every `every` steps (the
// last two kept).
inline void train_tiny_llama(const Dir& d, const std::string& ck, int steps, int every) {
  const auto run = run_command(
      std::string(MESHTRAIN_BIN) + " train " +
      d.write("llama.toml", "[model]\npreset = \"llama-tiny\"\nvocab = 400\nlayers = 2\nhidden = 64\nheads = 4\n"
                            "kv_heads = 2\nffn = 128\ntied = false\ndropout = 0.0\n[data]\ntrain = \"" +
                                (d.path / "tok/train.bin").string() + "\"\n[train]\nsteps = " + std::to_string(steps) +
                                "\nmicro_batch = 4\nglobal_batch = 4\nseq = 32\nlr = 1e-2\n[checkpoint]\ndir = \"" + ck +
                                "\"\nevery = " + std::to_string(every) + "\nkeep = 2\nasync = false\n"));
  ASSERT_EQ(run.code, 0) << run.output;
}

}  // namespace meshtrain::test
