#include "meshtrain/data/tasks.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <random>
#include <stdexcept>

namespace meshtrain {

int64_t CharVocab::size() { return static_cast<int64_t>(std::strlen(kChars)); }

std::vector<int64_t> CharVocab::encode(const std::string& text) {
  std::vector<int64_t> out;
  for (char c : text) {
    const char* at = std::strchr(kChars, c);
    if (c == '\0' || !at) throw std::invalid_argument(fmt::format("character '{}' is not in the task vocabulary", c));
    out.push_back(at - kChars);
  }
  return out;
}

std::string CharVocab::decode(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += id >= 0 && id < size() ? kChars[id] : '?';
  return out;
}

std::vector<TaskExample> task_examples(const std::string& name, uint64_t seed, int64_t count, int digits) {
  if (digits < 1 || digits > 9) throw std::invalid_argument(fmt::format("task digits {} must be in 1..9", digits));
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 7);
  auto below = [&](uint64_t n) { return static_cast<int64_t>(rng() % n); };
  int64_t top = 1;
  for (int i = 0; i < digits; ++i) top *= 10;
  auto number = [&] { return below(static_cast<uint64_t>(top)); };  // uniform below 10^digits
  std::vector<TaskExample> out;
  for (int64_t i = 0; i < count; ++i) {
    if (name == "arithmetic") {
      int64_t a = number(), b = number();
      const int op = static_cast<int>(below(3));
      if (op == 1 && b > a) std::swap(a, b);
      const char sym = "+-*"[op];
      const int64_t r = op == 0 ? a + b : op == 1 ? a - b : a * b;
      out.push_back({fmt::format("{}{}{}=", a, sym, b), std::to_string(r)});
    } else if (name == "reverse") {
      std::string w;
      const int n = 1 + static_cast<int>(below(static_cast<uint64_t>(digits)));
      for (int j = 0; j < n; ++j) w += static_cast<char>('a' + below(26));
      out.push_back({"rev:" + w + "=", std::string(w.rbegin(), w.rend())});
    } else {
      throw std::invalid_argument(fmt::format("unknown task \"{}\": use arithmetic or reverse", name));
    }
  }
  return out;
}

TaskSplit task_split(const std::string& name, uint64_t seed, int64_t count, int digits) {
  TaskSplit out;
  std::set<std::string> held;
  const int64_t small = count / 4 + 1;
  for (auto& e : task_examples(name, seed + 2000, small, digits)) {
    if (held.insert(e.prompt).second) out.eval.push_back(std::move(e));
  }
  // Draw more than needed and skip the held-out prompts.
  auto fill = [&](std::vector<TaskExample>& into, uint64_t s, int64_t n) {
    for (auto& e : task_examples(name, s, 2 * n + 64, digits)) {
      if (static_cast<int64_t>(into.size()) == n) break;
      if (!held.count(e.prompt)) into.push_back(std::move(e));
    }
  };
  fill(out.train, seed, count);
  fill(out.prompts, seed + 1000, small);
  return out;
}

std::string near_miss(const TaskExample& e, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 11);
  std::string w = e.answer;
  const bool digits = std::all_of(w.begin(), w.end(), [](char c) { return std::isdigit(c) != 0; });
  if (!digits && w.size() > 1 && rng() % 2 == 0) {
    const size_t i = rng() % (w.size() - 1);
    if (w[i] != w[i + 1]) {
      std::swap(w[i], w[i + 1]);
      return w;
    }
  }
  // One position changed to another symbol of its kind (10 digits or 26 letters).
  const size_t i = rng() % w.size();
  const int kinds = digits ? 10 : 26;
  const char base = digits ? '0' : 'a';
  const int lowest = digits && i == 0 && w.size() > 1 ? 1 : 0;
  const int now = w[i] - base;
  int pick = lowest + static_cast<int>(rng() % static_cast<uint64_t>(kinds - lowest - 1));
  if (pick >= now) ++pick;  // skip the right symbol
  w[i] = static_cast<char>(base + pick);
  return w;
}

std::vector<TaskExample> read_task_examples(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("cannot read {}", path));
  std::vector<TaskExample> out;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      out.push_back({j.at("prompt").get<std::string>(), j.at("answer").get<std::string>()});
      CharVocab::encode(out.back().prompt);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("{} line {}: {} (want {{\"prompt\": \"...\", \"answer\": \"...\"}})", path,
                                              line_no, e.what()));
    }
  }
  if (out.empty()) throw std::invalid_argument(fmt::format("{} holds no examples", path));
  return out;
}

TaskReward task_reward(const std::vector<int64_t>& completion, const TaskExample& e) {
  const auto end = std::find(completion.begin(), completion.end(), CharVocab::end());
  const std::string text = CharVocab::decode({completion.begin(), end});
  TaskReward r;
  r.exact = text == e.answer ? 1.0 : 0.0;
  const bool digits = std::all_of(e.answer.begin(), e.answer.end(), [](char c) { return std::isdigit(c) != 0; });
  const bool kind = !text.empty() && std::all_of(text.begin(), text.end(), [&](char c) {
    return digits ? std::isdigit(c) != 0 : std::islower(c) != 0;
  });
  r.format = end != completion.end() && kind ? 0.1 : 0.0;
  return r;
}

}  // namespace meshtrain
