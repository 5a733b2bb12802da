// `meshtrain tokenize`: train a SentencePiece BPE tokenizer on a corpus (or load
// a given one) and write train / validation token shards (data/shard.h).
//
// Documents are the corpus's non-empty lines (or, with `blank_line_documents`,
// blocks separated by blank lines); each is encoded and followed by the
// end-of-sequence id, and its start is recorded as a document boundary. The
// last `val_fraction` of the documents form the validation shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string tokenizer;     // existing SentencePiece model; empty = train one
  int vocab_size = 4096;
  double val_fraction = 0.005;
  bool blank_line_documents = false;
  bool force = false;  // replace an earlier tokenization in out_dir
};

struct TokenizeReport {
  std::string tokenizer_path, train_path, val_path;
  int vocab_size = 0;
  uint64_t documents = 0, train_tokens = 0, val_tokens = 0, bytes = 0;
};

// Throws std::invalid_argument / std::runtime_error naming the file or option.
// Links SentencePiece: never call it from a process that loaded libtorch.
TokenizeReport tokenize_corpus(const TokenizeOptions& o);

// Trains a SentencePiece BPE model (byte fallback; unk 0, bos 1, eos 2) on
// text files (a line is a sentence) into PREFIX.model and PREFIX.vocab.
void train_tokenizer(const std::vector<std::string>& inputs, const std::string& prefix, int vocab_size);

// Encode / decode with a trained model (for sampling and tests).
class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  int eos_id() const;
  int bos_id() const;
  int unk_id() const;
  std::string piece(int id) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace meshtrain
