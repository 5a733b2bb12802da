// `meshtrain data filter`: a filtered copy of a corpus and a report of what
// went and why. Each document meets, in order: exact deduplication (a 64-bit
// hash of its normalised text; the first copy stays), the quality rules
// (data/quality.h), then near-deduplication (data/minhash.h; only documents
// that passed both earlier steps enter the index). The first step that
// removes a document names it in the report, with counts and a few examples
// (where, and the start of the text) per reason.
//
// Output: JSON lines in, the kept lines as they were; text in, the kept
// documents joined as they were split (a blank line between paragraphs or
// files, a newline between lines); an output ending in .jsonl gets
// {"text", "source"} lines whatever came in. Written to a temporary file and
// renamed: the output is whole or absent; an existing output is refused
// unless `force`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/documents.h"
#include "meshtrain/data/minhash.h"
#include "meshtrain/data/quality.h"

namespace meshtrain {

struct FilterOptions {
  DocumentFormat format;
  bool exact = true, near = true, quality = true;
  MinHashOptions minhash;
  QualityOptions rules;
  int examples = 3;  // per reason
  bool force = false;
};

struct FilterReport {
  struct Example {
    std::string where, text;  // text: its first 160 characters
    std::string detail;       // the rule's measurement, or the document it duplicates
  };
  int64_t documents = 0, kept = 0, bytes_in = 0, bytes_out = 0;
  std::map<std::string, int64_t> removed;  // reason: "exact_duplicate", "near_duplicate", or a quality rule
  std::map<std::string, std::vector<Example>> examples;
  double seconds = 0;
  std::string text() const;
  nlohmann::json json() const;
};

FilterReport filter_corpus(const std::vector<std::string>& inputs, const std::string& output, const FilterOptions& o);

}  // namespace meshtrain
