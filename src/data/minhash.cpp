#include "meshtrain/data/minhash.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <random>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

namespace meshtrain {
namespace {

constexpr uint64_t kPrime = (uint64_t{1} << 61) - 1;  // Mersenne prime 2^61 - 1

// (a x + b) mod 2^61 - 1 without overflow (x < 2^64 reduced first).
uint64_t mod_hash(uint64_t a, uint64_t b, uint64_t x) {
  x = (x & kPrime) + (x >> 61);
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * x + b;
  uint64_t r = static_cast<uint64_t>(p & kPrime) + static_cast<uint64_t>(p >> 61);
  r = (r & kPrime) + (r >> 61);
  return r >= kPrime ? r - kPrime : r;
}

std::vector<std::string_view> split_words(const std::string& normalized) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < normalized.size()) {
    const size_t j = normalized.find(' ', i);
    const size_t end = j == std::string::npos ? normalized.size() : j;
    if (end > i) words.emplace_back(normalized.data() + i, end - i);
    i = end + 1;
  }
  return words;
}

}  // namespace

std::string normalize_text(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool space = true;  // drops leading whitespace
  for (unsigned char c : text) {
    if (std::isspace(c)) {
      if (!space) out += ' ', space = true;
    } else if (c >= 0x80 || std::isalnum(c)) {  // UTF-8 bytes kept as they are
      out += static_cast<char>(std::tolower(c));
      space = false;
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<uint64_t> shingle_hashes(const std::string& normalized, int ngram) {
  if (ngram < 1) throw std::invalid_argument(fmt::format("n-gram length {} must be at least 1", ngram));
  const std::vector<std::string_view> words = split_words(normalized);
  std::vector<uint64_t> out;
  if (words.empty()) return out;
  const size_t n = std::min<size_t>(static_cast<size_t>(ngram), words.size());
  for (size_t i = 0; i + n <= words.size(); ++i) {
    const char* begin = words[i].data();
    const char* end = words[i + n - 1].data() + words[i + n - 1].size();
    out.push_back(XXH3_64bits(begin, static_cast<size_t>(end - begin)));
  }
  return out;
}

double jaccard(const std::string& a, const std::string& b, int ngram) {
  const auto ha = shingle_hashes(normalize_text(a), ngram), hb = shingle_hashes(normalize_text(b), ngram);
  const std::unordered_set<uint64_t> sa(ha.begin(), ha.end()), sb(hb.begin(), hb.end());
  size_t both = 0;
  for (uint64_t h : sa) both += sb.count(h);
  const size_t either = sa.size() + sb.size() - both;
  return either == 0 ? 1.0 : static_cast<double>(both) / static_cast<double>(either);
}

MinHasher::MinHasher(const MinHashOptions& o) : o_(o) {
  if (o.bands < 1 || o.rows < 1) {
    throw std::invalid_argument(fmt::format("MinHash bands {} and rows {} must be at least 1", o.bands, o.rows));
  }
  if (o.ngram < 1) throw std::invalid_argument(fmt::format("--ngram {} must be at least 1", o.ngram));
  if (!(o.threshold > 0 && o.threshold <= 1)) {
    throw std::invalid_argument(fmt::format("near-duplicate threshold {} must be in (0, 1]", o.threshold));
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<uint64_t> pick(1, kPrime - 1);
  for (int i = 0; i < o.bands * o.rows; ++i) a_.push_back(pick(rng)), b_.push_back(pick(rng));
}

std::vector<uint32_t> MinHasher::signature(const std::string& normalized) const {
  const std::vector<uint64_t> shingles = shingle_hashes(normalized, o_.ngram);
  std::vector<uint64_t> mins(a_.size(), std::numeric_limits<uint64_t>::max());
  for (uint64_t x : shingles)
    for (size_t i = 0; i < a_.size(); ++i) mins[i] = std::min(mins[i], mod_hash(a_[i], b_[i], x));
  std::vector<uint32_t> sig(mins.size());
  for (size_t i = 0; i < mins.size(); ++i) sig[i] = static_cast<uint32_t>(mins[i]);
  return sig;
}

double estimated_jaccard(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.size() != b.size() || a.empty()) throw std::invalid_argument("signatures of different lengths");
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

std::optional<NearDuplicateIndex::Match> NearDuplicateIndex::check_and_add(int64_t id, std::vector<uint32_t> sig) {
  if (bands_.empty()) bands_.resize(static_cast<size_t>(o_.bands));
  std::vector<uint64_t> keys(bands_.size());
  std::optional<Match> best;
  for (size_t band = 0; band < bands_.size(); ++band) {
    keys[band] = XXH3_64bits(sig.data() + band * o_.rows, sizeof(uint32_t) * static_cast<size_t>(o_.rows));
    auto it = bands_[band].find(keys[band]);
    if (it == bands_[band].end() || (best && best->id == it->second)) continue;
    const double est = estimated_jaccard(sig, kept_.at(it->second));
    if (est >= o_.threshold && (!best || est > best->estimated)) best = Match{it->second, est};
  }
  if (best) return best;
  for (size_t band = 0; band < bands_.size(); ++band) bands_[band].emplace(keys[band], id);
  kept_.emplace(id, std::move(sig));
  return std::nullopt;
}

}  // namespace meshtrain
