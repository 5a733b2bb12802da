// Quality heuristics in the style of Gopher's rules (Rae et al. 2021,
// arXiv 2112.11446, App. A.1.1 "quality filters" and the repetition filters
// after them), with their published thresholds as defaults. Words are the
// whitespace-separated tokens of the document; each rule returns the value it
// measured, so a report can say why a document went.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace meshtrain {

struct QualityOptions {
  int64_t min_words = 50, max_words = 100000;
  double min_mean_word = 3, max_mean_word = 10;  // characters
  double max_symbol_ratio = 0.1;    // ("#" + "..." + "…") per word
  double max_bullet_lines = 0.9;    // lines starting with a bullet
  double max_ellipsis_lines = 0.3;  // lines ending with an ellipsis
  double min_alpha_words = 0.8;     // words with an alphabetic character
  int min_stop_words = 2;           // of the, be, to, of, and, that, have, with (occurrences)
  bool repetition = true;           // the repetition rules below
  double max_dup_lines = 0.3, max_dup_paragraphs = 0.3;                  // duplicated elements / all
  double max_dup_line_chars = 0.2, max_dup_paragraph_chars = 0.2;        // their characters / the text's
  std::map<int, double> max_top_ngram_chars{{2, 0.20}, {3, 0.18}, {4, 0.16}};  // the most frequent n-gram
  std::map<int, double> max_dup_ngram_chars{{5, 0.15}, {6, 0.14}, {7, 0.13},
                                            {8, 0.12}, {9, 0.11}, {10, 0.10}};  // all repeated n-grams
};

struct QualityVerdict {
  std::string rule;    // "" when every rule passes; else the first that fails, e.g. "mean_word_length"
  std::string detail;  // what it measured against its bound, e.g. "2.41 < 3"
  bool ok() const { return rule.empty(); }
};

QualityVerdict check_quality(const std::string& text, const QualityOptions& o);

}  // namespace meshtrain
