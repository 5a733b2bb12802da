#include "meshtrain/data/ending_task.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): the same draws on every platform, unlike std's distributions.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

std::string join(const std::vector<std::string>& w, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += (i > begin ? " " : "") + w[i];
  return out;
}

}  // namespace

namespace {

void check_fraction(double fraction) {
  if (!(fraction > 0 && fraction < 1)) {
    throw std::invalid_argument(fmt::format("--held-out {} must be in (0, 1): the fraction tokenize held out "
                                            "(its --val-fraction)", fraction));
  }
}

// meshtrain tokenize's validation count.
size_t held_out_count(int64_t total, double fraction) {
  const size_t n = static_cast<size_t>(validation_documents(total, fraction));
  if (n >= static_cast<size_t>(total)) {
    throw std::invalid_argument(fmt::format("{} document(s): --held-out {} would take every one", total, fraction));
  }
  return n;
}

}  // namespace

HeldOut held_out_documents(const std::vector<std::string>& inputs, const DocumentFormat& format, double fraction) {
  check_fraction(fraction);
  HeldOut h;
  Document d;
  {
    DocumentReader count(inputs, format);
    while (count.next(d)) ++h.total;
  }
  const size_t n = held_out_count(h.total, fraction);
  DocumentReader read(inputs, format);
  for (int64_t i = 0; read.next(d); ++i) {
    if (i >= h.total - static_cast<int64_t>(n)) h.documents.push_back(std::move(d.text));
  }
  return h;
}

HeldOut held_out_documents(const std::vector<std::string>& documents, double fraction) {
  check_fraction(fraction);
  HeldOut h;
  h.total = static_cast<int64_t>(documents.size());
  const size_t n = held_out_count(h.total, fraction);
  h.documents.assign(documents.end() - static_cast<int64_t>(n), documents.end());
  return h;
}

EndingTask ending_task(const HeldOut& h, const EndingTaskOptions& o) {
  if (o.choices < 2) throw std::invalid_argument(fmt::format("--choices {} must be at least 2", o.choices));
  if (o.min_words < 2) throw std::invalid_argument(fmt::format("--min-words {} must be at least 2", o.min_words));
  if (o.questions < 0) throw std::invalid_argument(fmt::format("--questions {} must be >= 0 (0: all)", o.questions));
  EndingTask t;
  t.documents = h.total;
  t.held_out = static_cast<int64_t>(h.documents.size());
  struct Halves {
    std::string first, second;
  };
  std::vector<Halves> usable;
  for (const auto& doc : h.documents) {
    const auto w = words_of(doc);
    if (static_cast<int64_t>(w.size()) < o.min_words) {
      ++t.short_documents;
      continue;
    }
    const size_t cut = w.size() / 2;
    usable.push_back({join(w, 0, cut), " " + join(w, cut, w.size())});
  }
  if (static_cast<int64_t>(usable.size()) < o.choices) {
    throw std::invalid_argument(fmt::format(
        "{} held-out document(s) have at least {} words; {} choices need as many (raise --held-out or lower "
        "--min-words / --choices)", usable.size(), o.min_words, o.choices));
  }
  // Endings repeat in a corpus (a refrain): the draws below need `choices` distinct ones to end.
  std::vector<std::string> distinct;
  for (const auto& h : usable) distinct.push_back(h.second);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (static_cast<int64_t>(distinct.size()) < o.choices) {
    throw std::invalid_argument(fmt::format("the held-out documents have {} distinct ending(s); {} choices need as many",
                                            distinct.size(), o.choices));
  }
  SplitMix rng{o.seed};
  std::vector<size_t> order(usable.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);  // Fisher-Yates
  const size_t n = o.questions > 0 ? std::min(order.size(), static_cast<size_t>(o.questions)) : order.size();
  for (size_t k = 0; k < n; ++k) {
    const Halves& q = usable[order[k]];
    ChoiceItem item;
    item.context = q.first;
    item.line = static_cast<int64_t>(k) + 1;
    std::vector<std::string> endings{q.second};
    while (static_cast<int64_t>(endings.size()) < o.choices) {
      const std::string& e = usable[rng.below(usable.size())].second;
      if (std::find(endings.begin(), endings.end(), e) == endings.end()) endings.push_back(e);
    }
    item.answer = static_cast<int64_t>(rng.below(static_cast<uint64_t>(o.choices)));
    std::swap(endings[0], endings[static_cast<size_t>(item.answer)]);
    item.choices = std::move(endings);
    t.items.push_back(std::move(item));
  }
  return t;
}

void write_choice_task(const std::vector<ChoiceItem>& items, const std::string& path, bool force) {
  namespace fs = std::filesystem;
  if (fs::exists(path) && !force) throw std::invalid_argument(fmt::format("{} exists; pass --force to replace it", path));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw std::invalid_argument(fmt::format("{}: cannot be written", tmp));
    for (const auto& q : items) {
      out << nlohmann::json{{"context", q.context}, {"choices", q.choices}, {"answer", q.answer}}.dump() << "\n";
    }
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error(fmt::format("{}: write failed", tmp));
    }
  }
  fs::rename(tmp, path);
}

}  // namespace meshtrain
