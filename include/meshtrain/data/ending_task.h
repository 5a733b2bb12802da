// The demo's multiple-choice task (data/choice_task.h), made from a corpus:
// which ending completes a document? Each question is a held-out document (a
// KJV verse, say) cut at its middle word: the first half is the context, its
// own second half the answer, and the second halves of other held-out
// documents the distractors. Held out: the last `held_out` fraction of the
// documents, as `meshtrain tokenize --val-fraction` splits them (the same
// count, max(1, floor(n x fraction))), so with the same fraction and document
// rule no question was trained on. A distractor ending is as unseen as the
// answer, and may be longer or shorter: what the length-normalised accuracy
// corrects for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/documents.h"

namespace meshtrain {

struct EndingTaskOptions {
  double held_out = 0.005;  // meshtrain tokenize's default --val-fraction
  int64_t questions = 0;    // 0: every held-out document with enough words
  int64_t choices = 4;
  int64_t min_words = 8;    // shorter documents are neither questions nor distractors
  uint64_t seed = 1;        // the questions' order, the distractors and the answer's place
};

struct EndingTask {
  std::vector<ChoiceItem> items;
  int64_t documents = 0, held_out = 0, short_documents = 0;  // short: held out, fewer than min_words
};

// The held-out documents: the last max(1, floor(n x fraction)) of a corpus's
// n (meshtrain tokenize's count), and n. Two passes over the files (count,
// then keep the tail): memory holds the held-out documents only.
struct HeldOut {
  std::vector<std::string> documents;
  int64_t total = 0;
};
HeldOut held_out_documents(const std::vector<std::string>& inputs, const DocumentFormat& format, double fraction);
HeldOut held_out_documents(const std::vector<std::string>& documents, double fraction);  // in memory

// Throws std::invalid_argument naming the option or the shortage (fewer usable
// held-out documents than choices).
EndingTask ending_task(const HeldOut& h, const EndingTaskOptions& o);

// The task as JSON lines, written to `path` whole or not at all (a temporary
// file renamed), refusing to replace an existing file unless `force`.
void write_choice_task(const std::vector<ChoiceItem>& items, const std::string& path, bool force);

}  // namespace meshtrain
