#include "meshtrain/data/quality.h"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

namespace meshtrain {
namespace {

std::vector<std::string_view> split_on(std::string_view text, bool paragraphs) {
  // Lines: split at newlines; paragraphs: at runs of two or more. Empty pieces dropped.
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size()) {
      if (text[j] == '\n' && (!paragraphs || (j + 1 < text.size() && text[j + 1] == '\n'))) break;
      ++j;
    }
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
    while (i < text.size() && text[i] == '\n') ++i;
  }
  return out;
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

size_t count(std::string_view s, std::string_view what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string_view::npos; i = s.find(what, i + what.size())) ++n;
  return n;
}

// Elements seen before and their characters.
std::pair<size_t, size_t> duplicates(const std::vector<std::string_view>& elements) {
  std::unordered_set<std::string_view> seen;
  size_t n = 0, chars = 0;
  for (auto e : elements) {
    if (!seen.insert(e).second) ++n, chars += e.size();
  }
  return {n, chars};
}

// The n-gram of words starting at i, as the text between its first and last word.
std::string_view ngram(const std::vector<std::string_view>& w, size_t i, int n) {
  return {w[i].data(), static_cast<size_t>(w[i + n - 1].data() + w[i + n - 1].size() - w[i].data())};
}

QualityVerdict fail(std::string rule, std::string detail) { return {std::move(rule), std::move(detail)}; }

}  // namespace

QualityVerdict check_quality(const std::string& text, const QualityOptions& o) {
  const std::vector<std::string_view> words = split_words(text);
  const auto nw = static_cast<int64_t>(words.size());
  if (nw < o.min_words) return fail("words", fmt::format("{} < {}", nw, o.min_words));
  if (nw > o.max_words) return fail("words", fmt::format("{} > {}", nw, o.max_words));
  size_t letters = 0, alpha_words = 0, stop = 0;
  static const std::unordered_set<std::string> kStop = {"the", "be", "to", "of", "and", "that", "have", "with"};
  for (auto w : words) {
    letters += w.size();
    bool alpha = false;
    std::string bare;
    for (unsigned char c : w) {
      if (std::isalpha(c) || c >= 0x80) alpha = true;
      if (std::isalpha(c)) bare += static_cast<char>(std::tolower(c));
    }
    alpha_words += alpha;
    stop += kStop.count(bare);
  }
  const double mean = static_cast<double>(letters) / static_cast<double>(nw);
  if (mean < o.min_mean_word) return fail("mean_word_length", fmt::format("{:.2f} < {}", mean, o.min_mean_word));
  if (mean > o.max_mean_word) return fail("mean_word_length", fmt::format("{:.2f} > {}", mean, o.max_mean_word));
  const double symbols =
      static_cast<double>(count(text, "#") + count(text, "...") + count(text, "\xE2\x80\xA6")) / static_cast<double>(nw);
  if (symbols > o.max_symbol_ratio) return fail("symbol_ratio", fmt::format("{:.3f} > {}", symbols, o.max_symbol_ratio));
  const std::vector<std::string_view> lines = split_on(text, false);
  size_t bullets = 0, ellipses = 0;
  for (auto line : lines) {
    const std::string_view t = trim(line);
    for (std::string_view b : {"\xE2\x80\xA2", "-", "*", "\xE2\x80\xA3", "\xE2\x97\x8F"}) {
      if (starts_with(t, b)) {
        ++bullets;
        break;
      }
    }
    ellipses += ends_with(t, "...") || ends_with(t, "\xE2\x80\xA6");
  }
  const double nl = static_cast<double>(std::max<size_t>(lines.size(), 1));
  if (bullets / nl > o.max_bullet_lines) return fail("bullet_lines", fmt::format("{:.3f} > {}", bullets / nl, o.max_bullet_lines));
  if (ellipses / nl > o.max_ellipsis_lines) {
    return fail("ellipsis_lines", fmt::format("{:.3f} > {}", ellipses / nl, o.max_ellipsis_lines));
  }
  const double alpha = static_cast<double>(alpha_words) / static_cast<double>(nw);
  if (alpha < o.min_alpha_words) return fail("alpha_words", fmt::format("{:.3f} < {}", alpha, o.min_alpha_words));
  if (static_cast<int>(stop) < o.min_stop_words) return fail("stop_words", fmt::format("{} < {}", stop, o.min_stop_words));
  if (!o.repetition) return {};

  const double chars = static_cast<double>(text.size());
  const std::vector<std::string_view> paragraphs = split_on(text, true);
  const auto [dup_p, dup_p_chars] = duplicates(paragraphs);
  const auto [dup_l, dup_l_chars] = duplicates(lines);
  const double fp = static_cast<double>(dup_p) / static_cast<double>(std::max<size_t>(paragraphs.size(), 1));
  if (fp > o.max_dup_paragraphs) return fail("dup_paragraphs", fmt::format("{:.3f} > {}", fp, o.max_dup_paragraphs));
  if (dup_p_chars / chars > o.max_dup_paragraph_chars) {
    return fail("dup_paragraph_chars", fmt::format("{:.3f} > {}", dup_p_chars / chars, o.max_dup_paragraph_chars));
  }
  if (dup_l / nl > o.max_dup_lines) return fail("dup_lines", fmt::format("{:.3f} > {}", dup_l / nl, o.max_dup_lines));
  if (dup_l_chars / chars > o.max_dup_line_chars) {
    return fail("dup_line_chars", fmt::format("{:.3f} > {}", dup_l_chars / chars, o.max_dup_line_chars));
  }
  for (const auto& [n, bound] : o.max_top_ngram_chars) {
    if (nw < n) continue;
    std::unordered_map<std::string_view, size_t> counts;
    std::string_view top;
    size_t top_count = 0;
    for (size_t i = 0; i + n <= words.size(); ++i) {
      const std::string_view g = ngram(words, i, n);
      const size_t c = ++counts[g];
      if (c > top_count || (c == top_count && g.size() > top.size())) top = g, top_count = c;
    }
    const double f = top_count > 1 ? static_cast<double>(top.size() * top_count) / chars : 0;
    if (f > bound) return fail(fmt::format("top_{}gram_chars", n), fmt::format("{:.3f} > {}", f, bound));
  }
  for (const auto& [n, bound] : o.max_dup_ngram_chars) {
    if (nw < n) continue;
    // Characters of n-grams seen before, each repeat counted once and skipped over.
    std::unordered_set<std::string_view> seen;
    size_t repeated = 0;
    for (size_t i = 0; i + n <= words.size();) {
      const std::string_view g = ngram(words, i, n);
      if (!seen.insert(g).second) {
        repeated += g.size();
        i += static_cast<size_t>(n);
      } else {
        ++i;
      }
    }
    const double f = static_cast<double>(repeated) / chars;
    if (f > bound) return fail(fmt::format("dup_{}gram_chars", n), fmt::format("{:.3f} > {}", f, bound));
  }
  return {};
}

}  // namespace meshtrain
