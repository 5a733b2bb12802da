// Evaluation of fine-tuned models in one process (tp = 1): a checkpoint's
// model with its adapters merged, and the exact-match rate of SFT answers.
//
// Exact match under greedy decoding, computed teacher-forced: greedy decoding
// from a conversation's prompt reproduces its answer exactly if and only if,
// at every trained target, the argmax of the logits given the gold prefix is
// that target (by induction over the answer's tokens: each step's greedy
// choice is the gold token, so the next step sees the gold prefix). One forward
// per block therefore scores every conversation in it, no generation loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/loader.h"

namespace meshtrain {

class Comm;
class Transformer;

// The checkpoint's model (spec from its manifest) with the weights of
// ckpt::model_weights: LoRA adapters merged, a QLoRA run's base found again.
// `solo`: a one-rank group that outlives the model. With `tiled`, tiled
// attention whatever the run used (the same function; document masks need it).
std::unique_ptr<Transformer> load_for_inference(const std::string& ckpt_dir, Comm& solo, bool tiled = false);

struct ExactMatch {
  int64_t answers = 0, exact = 0;    // conversations with trained targets, and those all right
  int64_t targets = 0, correct = 0;  // trained targets, and those whose argmax is the target
  double rate() const { return answers ? static_cast<double>(exact) / static_cast<double>(answers) : 0; }
  double token_accuracy() const { return targets ? static_cast<double>(correct) / static_cast<double>(targets) : 0; }
  ExactMatch& operator+=(const ExactMatch& o);
};

// `b` with doc_ids and loss-masked targets (data/chat.h's blocks); with
// `document_mask`, the forward keeps documents apart (as train.document_mask did).
ExactMatch exact_match(Transformer& m, const Batch& b, bool document_mask);
// Every block of `shards` (made by `meshtrain tokenize chat --seq seq`).
ExactMatch exact_match(Transformer& m, const std::vector<std::string>& shards, int64_t seq, bool document_mask);

}  // namespace meshtrain
