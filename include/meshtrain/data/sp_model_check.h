// A SentencePiece model file checked before SentencePiece reads it.
//
// SentencePiece 0.1.97 (Debian bookworm's) trusts the normalizer's
// precompiled character map inside a model: a damaged map makes its
// normalizer read outside the model (found by fuzzing, issue #43: a flipped
// bit segfaults `meshtrain tokenize --tokenizer`). The map is
//   <uint32 trie size><Darts-clone double-array trie><NUL-terminated strings>
// (sentencepiece/src/normalizer.cc, DecodePrecompiledCharsMap); the trie's
// units are read without bounds (darts.h, commonPrefixSearch), and a leaf's
// value is an offset into the strings, read up to its NUL.
#pragma once

#include <string>

namespace meshtrain {

// Walks the model's protobuf (ModelProto: normalizer_spec = 3,
// denormalizer_spec = 5; NormalizerSpec: precompiled_charsmap = 2) and checks
// every character map: the trie inside the map, every unit reachable from the
// root inside the trie (each node's 256 child slots included), every leaf's
// value inside the strings, the strings ending in NUL. Throws
// std::invalid_argument naming `path` and what is wrong.
void check_sentencepiece_model(const std::string& bytes, const std::string& path);

}  // namespace meshtrain
