// Near-duplicate detection by MinHash with LSH banding (Broder 1997; Leskovec,
// Rajaraman, Ullman, Mining of Massive Datasets ch. 3; as in Gopher's and
// datatrove's pipelines). A document is its set of word n-grams (shingles,
// over the normalised text). P = bands x rows hash functions h_i(x) = (a_i x +
// b_i) mod (2^61 - 1) over each shingle's 64-bit hash; the signature is each
// function's minimum. Two documents of Jaccard similarity J agree on one
// function with probability J, so they share a whole band with probability
// J^rows and become candidates with 1 - (1 - J^rows)^bands: with the default
// 14 x 8, 0.9996 at J = 0.9 and 0.0008 at J = 0.3. A candidate is confirmed
// when its estimated Jaccard (the fraction of equal minima) reaches the
// threshold.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshtrain {

struct MinHashOptions {
  int ngram = 5;           // words per shingle
  int bands = 14, rows = 8;
  double threshold = 0.8;  // estimated Jaccard at or above which a candidate is a near duplicate
  uint64_t seed = 1;
};

// Lower-cased (ASCII), punctuation dropped, whitespace runs as one space, trimmed: the text exact and near
// duplicates are judged on.
std::string normalize_text(const std::string& text);
// The 64-bit hashes of the normalised text's word n-grams (the text's words as one shingle when shorter).
std::vector<uint64_t> shingle_hashes(const std::string& normalized, int ngram);
// Exact Jaccard similarity of two texts' shingle sets (reports and tests).
double jaccard(const std::string& a, const std::string& b, int ngram);

class MinHasher {
 public:
  explicit MinHasher(const MinHashOptions& o);
  std::vector<uint32_t> signature(const std::string& normalized) const;
  const MinHashOptions& options() const { return o_; }

 private:
  MinHashOptions o_;
  std::vector<uint64_t> a_, b_;
};

double estimated_jaccard(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);

// The kept documents' signatures, banded. Memory: 4 P bytes per kept document plus one table entry per band.
class NearDuplicateIndex {
 public:
  explicit NearDuplicateIndex(const MinHashOptions& o) : o_(o) {}
  struct Match {
    int64_t id;        // the kept document it duplicates
    double estimated;  // estimated Jaccard
  };
  // A kept document this one nearly duplicates; otherwise it is kept (added under `id`) and none is returned.
  std::optional<Match> check_and_add(int64_t id, std::vector<uint32_t> signature);

 private:
  MinHashOptions o_;
  std::vector<std::unordered_map<uint64_t, int64_t>> bands_;  // band key -> kept document (first seen)
  std::unordered_map<int64_t, std::vector<uint32_t>> kept_;
};

}  // namespace meshtrain
