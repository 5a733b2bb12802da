// The small Llama-style model the single-process tests of post-training and
// RL build (2 layers, no dropout), with the vocabulary and sequence they need.
#pragma once

#include "meshtrain/plan/spec.h"

namespace meshtrain::test {

inline plan::ModelSpec tiny_llama(int64_t vocab, int64_t seq) {
  plan::ModelSpec m = plan::preset("llama-tiny");
  m.layers = 2, m.vocab = vocab, m.seq = seq, m.dropout = 0;
  return m;
}

}  // namespace meshtrain::test
