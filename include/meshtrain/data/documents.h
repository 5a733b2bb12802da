// Documents streamed from many files: plain text (documents split by a rule)
// or JSON lines with a text field, either one gzip-compressed or not (zlib
// reads both). Memory is one document (and one line) at a time, whatever the
// corpus size. The shared front end of `meshtrain data` and, later, the
// streaming tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

struct DocumentFormat {
  // "auto": .jsonl / .json (and .gz of them) are JSON lines, anything else text.
  std::string format = "auto";  // auto | text | jsonl
  std::string field = "text";   // JSON lines: the document's text
  // Text: how documents are split. "blank-line": paragraphs separated by empty lines; "line": one per line;
  // "file": each file is one document.
  std::string split = "blank-line";
};

struct Document {
  std::string text;
  std::string where;  // "file:line" of its first line
  std::string raw;    // JSON lines: the line itself (written back whole by a filter)
  bool jsonl = false;
};

// How many of a corpus's `documents` are validation (the last ones): max(1,
// floor(n x fraction)), 0 for fraction 0. meshtrain tokenize, tokenize stream
// and data choices all hold out this count.
int64_t validation_documents(int64_t documents, double fraction);

class DocumentReader {
 public:
  // Checks every path (readable, not empty) and the format before reading any: throws std::invalid_argument
  // naming the file and the fix.
  DocumentReader(std::vector<std::string> paths, DocumentFormat format);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document (empty ones skipped); false at the end. A JSON line that does not parse, or lacks the
  // field, throws std::invalid_argument naming file:line.
  bool next(Document& d);
  int64_t bytes_read() const { return bytes_; }

  // Whether `path` is read as JSON lines under `format`.
  static bool is_jsonl(const std::string& path, const DocumentFormat& format);

 private:
  bool open_next_file();
  bool read_line(std::string& line);  // false at the end of the current file

  std::vector<std::string> paths_;
  DocumentFormat format_;
  size_t file_ = 0;
  void* gz_ = nullptr;  // gzFile
  bool jsonl_ = false;
  int64_t line_no_ = 0, bytes_ = 0;
};

}  // namespace meshtrain
