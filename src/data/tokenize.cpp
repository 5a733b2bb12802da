#include "meshtrain/data/tokenize.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <unistd.h>
#include <fmt/ranges.h>

#include "meshtrain/data/documents.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/data/sp_model_check.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_documents(const std::vector<std::string>& inputs, bool blank_lines, uint64_t* bytes) {
  std::vector<std::string> docs;
  for (const auto& path : inputs) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error(fmt::format("cannot read corpus file {}", path));
    std::string line, block;
    while (std::getline(f, line)) {
      *bytes += line.size() + 1;
      if (!blank_lines) {
        if (!line.empty()) docs.push_back(line);
        continue;
      }
      if (line.empty()) {
        if (!block.empty()) docs.push_back(block);
        block.clear();
      } else {
        block += block.empty() ? line : "\n" + line;
      }
    }
    if (!block.empty()) docs.push_back(block);
  }
  return docs;
}

}  // namespace

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::Tokenizer(const std::string& model_path) : impl_(new Impl) {
  std::ifstream in(model_path, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  if (!in.good() && !in.eof()) {
    delete impl_;
    throw std::runtime_error(fmt::format("cannot read tokenizer {}", model_path));
  }
  try {
    check_sentencepiece_model(bytes, model_path);
  } catch (...) {
    delete impl_;
    throw;
  }
  auto st = impl_->sp.LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    delete impl_;
    throw std::runtime_error(fmt::format("cannot load tokenizer {}: {}", model_path, st.ToString()));
  }
}
Tokenizer::~Tokenizer() { delete impl_; }

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto st = impl_->sp.Encode(text, &ids);
  if (!st.ok()) throw std::runtime_error("tokenizer: " + st.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  auto st = impl_->sp.Decode(ids, &text);
  if (!st.ok()) throw std::runtime_error("tokenizer: " + st.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
int Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int Tokenizer::unk_id() const { return impl_->sp.unk_id(); }
std::string Tokenizer::piece(int id) const { return id < 0 ? "" : impl_->sp.IdToPiece(id); }

void train_tokenizer(const std::vector<std::string>& inputs, const std::string& prefix, int vocab_size) {
  const std::string args = fmt::format(
      "--input={} --model_prefix={} --model_type=bpe --vocab_size={} --character_coverage=1.0 "
      "--byte_fallback=true --hard_vocab_limit=false --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 "
      "--input_sentence_size=2000000 --shuffle_input_sentence=true --minloglevel=2 --num_threads=2",
      fmt::join(inputs, ","), prefix, vocab_size);
  auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) {
    throw std::runtime_error(fmt::format("training the tokenizer on {} failed: {}", fmt::join(inputs, ", "),
                                         st.ToString()));
  }
}

TokenizeReport tokenize_corpus(const TokenizeOptions& o) {
  if (o.inputs.empty()) throw std::invalid_argument("tokenize: give at least one --input corpus file");
  if (o.out_dir.empty()) throw std::invalid_argument("tokenize: give --out DIR");
  if (o.val_fraction < 0 || o.val_fraction >= 1) {
    throw std::invalid_argument(fmt::format("--val-fraction {} must be in [0, 1)", o.val_fraction));
  }
  if (o.tokenizer.empty() && (o.vocab_size < 320 || o.vocab_size > (1 << 20))) {
    throw std::invalid_argument(fmt::format(
        "--vocab-size {} must be in 320..1048576 (256 byte-fallback pieces, specials and the characters)", o.vocab_size));
  }
  for (const auto& in : o.inputs) {
    if (!fs::is_regular_file(in)) throw std::invalid_argument(fmt::format("corpus file {} does not exist", in));
  }
  for (const char* name : {"train.bin", "val.bin", "tokenizer.model"}) {
    const fs::path existing = fs::path(o.out_dir) / name;
    if (fs::exists(existing) && !o.force && !(o.tokenizer == existing.string())) {
      throw std::invalid_argument(fmt::format("{} already exists; pass --force to replace it, or choose another --out",
                                              existing.string()));
    }
  }
  // The corpus and its split first: a corpus SentencePiece cannot learn from
  // fails here, naming it, not inside the trainer.
  TokenizeReport r;
  const auto docs = read_documents(o.inputs, o.blank_line_documents, &r.bytes);
  if (docs.empty()) throw std::invalid_argument(fmt::format("the corpus ({}) has no text", fmt::join(o.inputs, ", ")));
  r.documents = docs.size();
  const size_t n_val = static_cast<size_t>(validation_documents(static_cast<int64_t>(docs.size()), o.val_fraction));
  if (n_val >= docs.size()) {
    throw std::invalid_argument(fmt::format("the corpus ({}) has {} document(s): the validation split (--val-fraction "
                                            "{}) would take every one; give more text or --val-fraction 0",
                                            fmt::join(o.inputs, ", "), docs.size(), o.val_fraction));
  }
  // Everything is written under temporary names and renamed at the end: a
  // failure leaves no partial output (and no file that blocks a rerun).
  fs::create_directories(o.out_dir);
  const std::string tag = fmt::format(".tmp-{}", ::getpid());
  std::vector<std::pair<fs::path, fs::path>> outputs;  // (temporary, final)
  auto output = [&](const std::string& name) {
    outputs.emplace_back(fs::path(o.out_dir) / (name + tag), fs::path(o.out_dir) / name);
    return outputs.back().first.string();
  };
  try {
    r.tokenizer_path = o.tokenizer;
    if (o.tokenizer.empty()) {
      const std::string prefix = (fs::path(o.out_dir) / ("tokenizer" + tag)).string();
      outputs.emplace_back(prefix + ".model", fs::path(o.out_dir) / "tokenizer.model");
      outputs.emplace_back(prefix + ".vocab", fs::path(o.out_dir) / "tokenizer.vocab");
      train_tokenizer(o.inputs, prefix, o.vocab_size);
      r.tokenizer_path = outputs[0].second.string();
    }
    Tokenizer tok(o.tokenizer.empty() ? outputs[0].first.string() : o.tokenizer);
    r.vocab_size = tok.vocab_size();
    const int width = r.vocab_size <= 65536 ? 2 : 4;
    auto write = [&](size_t begin, size_t end, const std::string& name, uint64_t* count) {
      std::vector<uint32_t> tokens;
      std::vector<uint64_t> starts;
      for (size_t i = begin; i < end; ++i) {
        starts.push_back(tokens.size());
        for (int id : tok.encode(docs[i])) tokens.push_back(static_cast<uint32_t>(id));
        tokens.push_back(static_cast<uint32_t>(tok.eos_id()));
      }
      write_shard(output(name), tokens, starts, width);
      *count = tokens.size();
      return (fs::path(o.out_dir) / name).string();
    };
    r.train_path = write(0, docs.size() - n_val, "train.bin", &r.train_tokens);
    if (n_val > 0) r.val_path = write(docs.size() - n_val, docs.size(), "val.bin", &r.val_tokens);
  } catch (...) {
    for (const auto& [tmp, final] : outputs) fs::remove(tmp);
    throw;
  }
  for (const auto& [tmp, final] : outputs) fs::rename(tmp, final);
  return r;
}

}  // namespace meshtrain
