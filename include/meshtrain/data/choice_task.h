// Multiple-choice tasks scored by log-likelihood (train/choice_eval.h), as the
// common evaluation harnesses do (EleutherAI's lm-evaluation-harness: HellaSwag,
// ARC, PIQA...).
//
// The task file: JSON lines, one question each,
//   {"context": "In the beginning God", "choices": [" created ...", " said ..."], "answer": 0}
// `answer` indexes `choices` (at least two, none empty). A choice is scored as
// the continuation of its context: include the space between them in the
// choice, as the harness's tasks do.
//
// Tokenized (what `meshtrain-tokenize choices` prints, one JSON line per
// question): the ids of the context, preceded by the end-of-sequence id (what
// precedes a document in the training shards), and of each choice, with the
// choice's length in characters (Unicode code points: the harness's len()) for
// the length-normalised accuracy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct ChoiceItem {
  std::string context;
  std::vector<std::string> choices;
  int64_t answer = 0;
  int64_t line = 0;  // in its file
};

// Every question of `path`. Throws std::invalid_argument naming file:line and
// the fix: unreadable or empty file, a line that is not JSON, a missing or
// mistyped field, fewer than two choices, an empty choice, an answer that is
// not an index of the choices.
std::vector<ChoiceItem> read_choice_task(const std::string& path);

struct TokenizedChoice {
  std::vector<int64_t> context;               // end-of-sequence id first
  std::vector<std::vector<int64_t>> choices;  // each non-empty
  std::vector<int64_t> chars;                 // each choice's length in code points
  int64_t answer = 0;
  int64_t line = 0;
};

// One JSON line, and back (the helper's output). parse throws
// std::invalid_argument naming what is wrong.
std::string tokenized_choice_line(const TokenizedChoice& q);
std::vector<TokenizedChoice> parse_tokenized_choices(const std::string& text);

// Unicode code points of UTF-8 text (bytes 10xxxxxx continue a character).
int64_t utf8_length(const std::string& text);

// A task's name in logs and metrics: the file's stem ("data/kjv/ending.jsonl" -> "ending").
std::string choice_task_name(const std::string& path);

}  // namespace meshtrain
