// The tokenizer a Hugging Face export carries (ckpt/hf.h): meshtrain's SentencePiece model
// (data/tokenize.h: BPE with byte fallback, <unk> <s> </s>), copied as tokenizer.model, with
//   tokenizer_config.json    tokenizer_class PreTrainedTokenizerFast, the special pieces, and no
//                            <s> or </s> added to encodings (meshtrain's data and `sample` add none);
//   special_tokens_map.json  the same pieces;
//   generation_config.json   bos/eos ids (config.json gets them too).
// transformers 5 (with sentencepiece and protobuf installed) converts tokenizer.model at load time
// with its generic SentencePiece converter, which keeps the model's normalizer (NFKC, extra
// whitespace removed), so AutoTokenizer encodes as meshtrain-tokenize does (tests/test_peers.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace meshtrain::ckpt {

struct HfTokenizer {
  struct Special {
    int64_t id = -1;  // -1: the model has none
    std::string piece;
  };
  std::string model;  // path of the SentencePiece model
  int64_t vocab = 0;
  Special unk, bos, eos;
};

// The model's pieces as the tokenizer's own process reads them (meshtrain-tokenize special).
// Throws naming the file when it is not a SentencePiece model.
HfTokenizer describe_tokenizer(const std::string& model_path);

// The tokenizer.model beside a checkpoint's first training shard (where `meshtrain tokenize`
// writes it), or "" when there is none.
std::string tokenizer_beside_data(const nlohmann::json& manifest);

// Throws std::invalid_argument when the tokenizer has more pieces than the model's vocabulary.
void check_hf_tokenizer(const HfTokenizer& t, int64_t model_vocab);
// Writes the files above into `dir`, and the bos/eos ids into `config` (config.json's object).
void write_hf_tokenizer(const HfTokenizer& t, int64_t model_vocab, int64_t max_length, const std::string& dir,
                        nlohmann::json& config);

}  // namespace meshtrain::ckpt
