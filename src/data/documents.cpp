#include "meshtrain/data/documents.h"

#include <algorithm>
#include <zlib.h>

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace meshtrain {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

}  // namespace

bool DocumentReader::is_jsonl(const std::string& path, const DocumentFormat& f) {
  if (f.format == "jsonl") return true;
  if (f.format == "text") return false;
  std::string p = path;
  if (ends_with(p, ".gz")) p = p.substr(0, p.size() - 3);
  return ends_with(p, ".jsonl") || ends_with(p, ".json");
}

DocumentReader::DocumentReader(std::vector<std::string> paths, DocumentFormat format)
    : paths_(std::move(paths)), format_(std::move(format)) {
  if (format_.format != "auto" && format_.format != "text" && format_.format != "jsonl") {
    throw std::invalid_argument(fmt::format("--format '{}': use auto, text or jsonl", format_.format));
  }
  if (format_.split != "blank-line" && format_.split != "line" && format_.split != "file") {
    throw std::invalid_argument(fmt::format("--split '{}': use blank-line, line or file", format_.split));
  }
  if (paths_.empty()) throw std::invalid_argument("no input files");
  for (const auto& p : paths_) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec)) throw std::invalid_argument(fmt::format("{}: not a readable file", p));
    if (std::filesystem::file_size(p, ec) == 0) throw std::invalid_argument(fmt::format("{}: empty file", p));
    gzFile g = gzopen(p.c_str(), "rb");
    if (!g) throw std::invalid_argument(fmt::format("{}: cannot be opened", p));
    gzclose(g);
  }
}

DocumentReader::~DocumentReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

bool DocumentReader::open_next_file() {
  if (gz_) gzclose(static_cast<gzFile>(gz_)), gz_ = nullptr;
  if (file_ >= paths_.size()) return false;
  const std::string& p = paths_[file_++];
  gz_ = gzopen(p.c_str(), "rb");
  if (!gz_) throw std::invalid_argument(fmt::format("{}: cannot be opened", p));
  gzbuffer(static_cast<gzFile>(gz_), 1 << 17);
  jsonl_ = is_jsonl(p, format_);
  line_no_ = 0;
  return true;
}

bool DocumentReader::read_line(std::string& line) {
  line.clear();
  if (!gz_) return false;
  char buf[1 << 14];
  while (gzgets(static_cast<gzFile>(gz_), buf, sizeof(buf))) {
    const size_t n = std::char_traits<char>::length(buf);
    bytes_ += static_cast<int64_t>(n);
    line.append(buf, n);
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      ++line_no_;
      return true;
    }
  }
  int err = Z_OK;
  const char* msg = gzerror(static_cast<gzFile>(gz_), &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    throw std::invalid_argument(fmt::format("{}: read error after line {}: {}", paths_[file_ - 1], line_no_, msg));
  }
  if (line.empty()) return false;
  ++line_no_;  // a last line without its newline
  return true;
}

int64_t validation_documents(int64_t documents, double fraction) {
  if (!(fraction > 0)) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(documents) * fraction));
}

bool DocumentReader::next(Document& d) {
  d = Document{};
  std::string line;
  while (true) {
    if (!gz_ && !open_next_file()) return false;
    const std::string& path = paths_[file_ - 1];
    if (jsonl_) {
      while (read_line(line)) {
        if (blank(line)) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          throw std::invalid_argument(fmt::format("{}:{}: not a JSON object", path, line_no_));
        }
        if (!j.is_object() || !j.contains(format_.field) || !j[format_.field].is_string()) {
          throw std::invalid_argument(fmt::format("{}:{}: no string field \"{}\" (--field names it)", path, line_no_,
                                                  format_.field));
        }
        d.text = j[format_.field].get<std::string>();
        if (d.text.empty()) continue;
        d.where = fmt::format("{}:{}", path, line_no_);
        d.raw = std::move(line);
        d.jsonl = true;
        return true;
      }
    } else if (format_.split == "line") {
      while (read_line(line)) {
        if (blank(line)) continue;
        d.text = std::move(line);
        d.where = fmt::format("{}:{}", path, line_no_);
        return true;
      }
    } else {
      // blank-line: a paragraph is consecutive non-blank lines; file: every line of the file.
      const bool whole = format_.split == "file";
      int64_t first = 0;
      while (read_line(line)) {
        if (blank(line) && !whole) {
          if (!d.text.empty()) break;
          continue;
        }
        if (d.text.empty()) first = line_no_;
        if (!d.text.empty()) d.text += '\n';
        d.text += line;
      }
      if (d.text.find_first_not_of(" \t\r\n") != std::string::npos) {
        d.where = fmt::format("{}:{}", path, first);
        return true;
      }
      d.text.clear();
    }
    gzclose(static_cast<gzFile>(gz_));
    gz_ = nullptr;
  }
}

}  // namespace meshtrain
