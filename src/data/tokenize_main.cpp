// meshtrain-tokenize: the tokenizer's own process (see CMakeLists.txt: it must
// not share a process with libtorch). `meshtrain tokenize` runs it with the same
// arguments:
//   --input FILE (repeatable) --out DIR [--vocab-size N] [--tokenizer MODEL]
//   [--val-fraction F] [--blank-line-documents] [--force]
// and, for `meshtrain sample`:
//   encode --tokenizer MODEL --text TEXT     prints the ids, space-separated
//   decode --tokenizer MODEL --ids "1 2 3"   prints the text (end-of-sequence: a new line)
//   vocab --tokenizer MODEL                  prints the number of pieces
#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/data/tokenize.h"

namespace {

int encode_or_decode(int argc, char** argv) {
  const std::string mode = argv[1];
  std::string model, text, ids;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer") model = argv[i + 1];
    else if (a == "--text") text = argv[i + 1];
    else if (a == "--ids") ids = argv[i + 1];
    else throw std::invalid_argument(fmt::format("unknown option '{}'", a));
  }
  if (model.empty()) throw std::invalid_argument(fmt::format("{} needs --tokenizer MODEL", mode));
  meshtrain::Tokenizer tok(model);
  if (mode == "vocab") {
    fmt::print("{}\n", tok.vocab_size());
    return 0;
  }
  if (mode == "encode") {
    for (int id : tok.encode(text)) fmt::print("{} ", id);
    fmt::print("\n");
    return 0;
  }
  std::vector<int> piece;
  std::string out;
  size_t pos = 0;
  auto flush = [&]() {
    out += tok.decode(piece);
    piece.clear();
  };
  while (pos < ids.size()) {
    size_t used = 0;
    const int id = std::stoi(ids.substr(pos), &used);
    pos += used;
    while (pos < ids.size() && ids[pos] == ' ') ++pos;
    if (id < 0 || id >= tok.vocab_size()) throw std::invalid_argument(fmt::format("token id {} outside the vocabulary", id));
    if (id == tok.eos_id()) {
      flush();
      out += "\n";
    } else {
      piece.push_back(id);
    }
  }
  flush();
  fmt::print("{}", out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  meshtrain::TokenizeOptions o;
  try {
    if (argc > 1 && (std::string(argv[1]) == "encode" || std::string(argv[1]) == "decode" ||
                     std::string(argv[1]) == "vocab")) {
      return encode_or_decode(argc, argv);
    }
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", a));
        return argv[++i];
      };
      auto number = [&](const std::string& v) {
        size_t used = 0;
        double d = 0;
        try {
          d = std::stod(v, &used);
        } catch (const std::exception&) {
        }
        if (used != v.size() || v.empty()) throw std::invalid_argument(fmt::format("{} '{}' is not a number", a, v));
        return d;
      };
      if (a == "--input") o.inputs.push_back(value());
      else if (a == "--out") o.out_dir = value();
      else if (a == "--vocab-size") o.vocab_size = static_cast<int>(number(value()));
      else if (a == "--tokenizer") o.tokenizer = value();
      else if (a == "--val-fraction") o.val_fraction = number(value());
      else if (a == "--blank-line-documents") o.blank_line_documents = true;
      else if (a == "--force") o.force = true;
      else throw std::invalid_argument(fmt::format("unknown option '{}'", a));
    }
    meshtrain::TokenizeReport r = meshtrain::tokenize_corpus(o);
    fmt::print("tokenizer {} ({} pieces)\n", r.tokenizer_path, r.vocab_size);
    fmt::print("{} documents, {} bytes -> {} train tokens ({}), {} validation tokens ({}); {:.2f} bytes per token\n",
               r.documents, r.bytes, r.train_tokens, r.train_path, r.val_tokens,
               r.val_path.empty() ? "none" : r.val_path,
               static_cast<double>(r.bytes) / static_cast<double>(r.train_tokens + r.val_tokens));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshtrain tokenize: error: {}\n", e.what());
    return 1;
  }
}
