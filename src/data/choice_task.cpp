#include "meshtrain/data/choice_task.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

namespace {

constexpr const char* kFormat = R"({"context": "...", "choices": [" ...", " ..."], "answer": 0})";

ChoiceItem parse_item(const std::string& line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const std::exception&) {
    throw std::invalid_argument(fmt::format("{}: not JSON (each line is {})", where, kFormat));
  }
  if (!j.is_object()) throw std::invalid_argument(fmt::format("{}: not a JSON object (each line is {})", where, kFormat));
  ChoiceItem q;
  if (j.contains("prompt") && !j.contains("context")) {
    throw std::invalid_argument(fmt::format("{}: a generation task's line ({{prompt, answer}}): score it with meshtrain "
                                            "eval task CKPT --data FILE; multiple choice is {}", where, kFormat));
  }
  if (!j.contains("context") || !j["context"].is_string()) {
    throw std::invalid_argument(fmt::format("{}: no string \"context\" (each line is {})", where, kFormat));
  }
  q.context = j["context"].get<std::string>();
  if (!j.contains("choices") || !j["choices"].is_array()) {
    throw std::invalid_argument(fmt::format("{}: no array \"choices\" (each line is {})", where, kFormat));
  }
  for (const auto& c : j["choices"]) {
    if (!c.is_string()) throw std::invalid_argument(fmt::format("{}: a choice that is not a string: {}", where, c.dump()));
    if (c.get<std::string>().empty()) {
      throw std::invalid_argument(fmt::format("{}: choice {} is empty (it has no tokens to score)", where, q.choices.size()));
    }
    q.choices.push_back(c.get<std::string>());
  }
  if (q.choices.size() < 2) {
    throw std::invalid_argument(fmt::format("{}: {} choice(s); a question needs at least two", where, q.choices.size()));
  }
  if (!j.contains("answer") || !j["answer"].is_number_integer()) {
    throw std::invalid_argument(
        fmt::format("{}: no whole-number \"answer\" (the index of the right choice, from 0)", where));
  }
  q.answer = j["answer"].get<int64_t>();
  if (q.answer < 0 || q.answer >= static_cast<int64_t>(q.choices.size())) {
    throw std::invalid_argument(fmt::format("{}: answer {} is out of range: {} choices, so 0..{}", where, q.answer,
                                            q.choices.size(), q.choices.size() - 1));
  }
  return q;
}

std::vector<int64_t> ids_of(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) throw std::invalid_argument(fmt::format("tokenized choices: \"{}\" is not a list of ids", what));
  return j.get<std::vector<int64_t>>();
}

}  // namespace

std::vector<ChoiceItem> read_choice_task(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw std::invalid_argument(fmt::format("{}: not a readable file (a task is JSON lines, each {})", path, kFormat));
  }
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("{}: cannot be opened", path));
  std::vector<ChoiceItem> out;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_item(line, fmt::format("{}:{}", path, line_no)));
    out.back().line = line_no;
  }
  if (out.empty()) throw std::invalid_argument(fmt::format("{}: no questions (each line is {})", path, kFormat));
  return out;
}

std::string tokenized_choice_line(const TokenizedChoice& q) {
  return nlohmann::json{{"context", q.context}, {"choices", q.choices}, {"chars", q.chars}, {"answer", q.answer},
                        {"line", q.line}}
      .dump();
}

std::vector<TokenizedChoice> parse_tokenized_choices(const std::string& text) {
  std::vector<TokenizedChoice> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("tokenized choices: not JSON: {}", line.substr(0, 80)));
    }
    TokenizedChoice q;
    q.context = ids_of(j.at("context"), "context");
    for (const auto& c : j.at("choices")) q.choices.push_back(ids_of(c, "choices"));
    q.chars = j.at("chars").get<std::vector<int64_t>>();
    q.answer = j.at("answer").get<int64_t>();
    q.line = j.at("line").get<int64_t>();
    if (q.chars.size() != q.choices.size() || q.answer < 0 || q.answer >= static_cast<int64_t>(q.choices.size())) {
      throw std::invalid_argument(fmt::format("tokenized choices: inconsistent question (line {})", q.line));
    }
    out.push_back(std::move(q));
  }
  return out;
}

int64_t utf8_length(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::string choice_task_name(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace meshtrain
