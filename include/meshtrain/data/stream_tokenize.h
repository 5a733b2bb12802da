// Streaming tokenization of large corpora (`meshtrain tokenize stream`): the
// documents of many files (text split by a rule, or JSON lines with a text
// field; gzip too: data/documents.h) encoded by several worker processes into
// token shards of bounded size, in memory that does not grow with the corpus.
//
// The output is what `meshtrain tokenize` (data/tokenize.h) writes for the
// same documents and tokenizer, cut into shards: the documents, each followed
// by the end-of-sequence id, the last max(1, floor(n x val_fraction)) of them
// validation (n counted in a first pass over the files). A shard holds whole
// documents and closes before the document that would take it past
// `shard_tokens` (a longer document gets a shard of its own):
//   DIR/train-00000.bin, train-00001.bin, ..., val-00000.bin, ...
// Shards depend on the documents alone, not on the number of workers.
//
// Memory: the open shard (shard_tokens ids), and per worker one chunk of
// documents (`chunk_bytes`) and its ids in flight.
//
// Resumable: after each shard DIR/progress.json records the documents written
// so far and the options and inputs (sizes, modification times) they came
// from; a run started again with the same ones skips those documents and
// writes the same shards as an uninterrupted run. DIR/index.json, written
// last, lists the shards and marks the run complete.
//
// The tokenizer: an existing SentencePiece model, or one trained (as
// `meshtrain tokenize` trains it) on the first `sample_bytes` of the documents.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/documents.h"

namespace meshtrain {

struct StreamTokenizeOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  DocumentFormat format{"auto", "text", "line"};  // meshtrain tokenize's rule: non-empty lines
  std::string tokenizer;                          // "": train one on a sample
  int vocab_size = 4096;
  int64_t sample_bytes = int64_t{100} << 20;
  double val_fraction = 0.005;
  int64_t shard_tokens = 100'000'000;
  int workers = 1;  // 1: encode in this process
  int64_t chunk_bytes = int64_t{1} << 20;
  bool force = false;  // start over in a directory that holds another run's shards
  // Tests: stop (exit status 3) right after this many shards are written, as an interruption would.
  int64_t exit_after_shards = 0;
};

struct StreamTokenizeReport {
  std::string tokenizer_path;
  std::vector<std::string> train_shards, val_shards;
  int64_t documents = 0, bytes = 0, train_tokens = 0, val_tokens = 0;
  int64_t resumed_documents = 0;  // skipped: written by an interrupted run
  double seconds = 0;             // the encoding pass
};

// Throws std::invalid_argument naming the option or input and the fix.
StreamTokenizeReport stream_tokenize(const StreamTokenizeOptions& o);

}  // namespace meshtrain
