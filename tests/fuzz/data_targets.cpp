// Fuzz targets: what `meshtrain tokenize` and the data tools read (token
// shards, documents, chat and preference JSON lines, task and choice files)
// and SentencePiece model files. No libtorch here: SentencePiece and libtorch
// cannot share a process (CMakeLists.txt). See fuzz.h.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fuzz.h"
#include "meshtrain/data/chat.h"
#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/documents.h"
#include "meshtrain/data/preference.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/data/tokenize.h"

namespace fs = std::filesystem;

namespace {

std::string valid_shard(int token_bytes) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 40; ++i) tokens.push_back((i * 2654435761u) % (token_bytes == 2 ? 65536u : 100000u));
  const std::string path = fuzz::write_scratch("valid.bin", "");
  meshtrain::write_shard(path, tokens, {0, 7, 8, 30}, token_bytes);
  return fuzz::read_file(path);
}

// An accepted shard: document starts ascend from 0 inside the tokens, every token reads.
void check_shard(const std::string& bytes) {
  const meshtrain::ShardReader r(fuzz::write_scratch("shard.bin", bytes));
  const auto starts = r.doc_starts();
  for (size_t i = 0; i < starts.size(); ++i) {
    if ((i == 0 && starts[0] != 0) || (i > 0 && starts[i] <= starts[i - 1]) || starts[i] >= r.size()) {
      throw fuzz::BadAccept("document starts that are not ascending from 0 inside the tokens");
    }
  }
  if (r.size() > (uint64_t{1} << 24)) throw fuzz::BadAccept("more tokens than the file holds");
  std::vector<int64_t> all(r.size());
  r.read(0, r.size(), all.data());
}

void check_documents(const std::string& text) {
  meshtrain::DocumentReader reader({fuzz::write_scratch("docs.jsonl", text)}, {});
  meshtrain::Document d;
  while (reader.next(d)) {
  }
}

// The tokenizer every chat target encodes with, trained once on a small text (byte fallback: any input encodes).
const meshtrain::Tokenizer& tokenizer() {
  static const std::unique_ptr<meshtrain::Tokenizer> tok = [] {
    std::string text;
    for (int i = 0; i < 200; ++i) {
      text += "In the beginning God created the heaven and the earth " + std::to_string(i * 7919 % 1000) + "\n";
    }
    const std::string prefix = (fs::path(fuzz::scratch()) / "sp").string();
    meshtrain::train_tokenizer({fuzz::write_scratch("sp.txt", text)}, prefix, 300);
    return std::make_unique<meshtrain::Tokenizer>(prefix + ".model");
  }();
  return *tok;
}

// Packed blocks: every block starts a conversation or padding, masks as long as the tokens.
void check_packing(const meshtrain::PackedChats& p, int64_t seq) {
  if (p.tokens.size() != p.mask.size() || (p.tokens.size() - 1) % static_cast<uint64_t>(seq) != 0) {
    throw fuzz::BadAccept("packed tokens and masks that do not make whole blocks");
  }
  for (size_t i = 1; i < p.doc_starts.size(); ++i) {
    if (p.doc_starts[i] <= p.doc_starts[i - 1] || p.doc_starts[i] >= p.tokens.size()) {
      throw fuzz::BadAccept("packed document starts out of order");
    }
  }
}

void check_chats(const std::string& text, bool pairs) {
  const auto chats = meshtrain::read_chats(fuzz::write_scratch(pairs ? "pairs.jsonl" : "chats.jsonl", text), pairs,
                                           [](const std::string& s) { return tokenizer().encode(s); });
  const uint32_t pad = static_cast<uint32_t>(tokenizer().eos_id());
  for (int64_t seq : {8, 64}) {
    try {
      check_packing(pairs ? meshtrain::pack_pairs(chats, seq, pad, true) : meshtrain::pack_chats(chats, seq, pad, true),
                    seq);
    } catch (const std::invalid_argument&) {
      // a prompt that fills the block (pairs): refused with its line
    }
  }
}

void check_tasks(const std::string& text) {
  for (const auto& e : meshtrain::read_task_examples(fuzz::write_scratch("task.jsonl", text))) {
    meshtrain::CharVocab::encode(e.prompt);  // accepted prompts are in the task vocabulary
  }
}

void check_choices(const std::string& text) {
  for (const auto& q : meshtrain::read_choice_task(fuzz::write_scratch("choice.jsonl", text))) {
    if (q.choices.size() < 2 || q.answer < 0 || q.answer >= static_cast<int64_t>(q.choices.size())) {
      throw fuzz::BadAccept("a question whose answer is not one of its choices");
    }
  }
}

// A model file as `meshtrain tokenize --tokenizer` loads it, then used.
void check_tokenizer_model(const std::string& bytes) {
  const meshtrain::Tokenizer tok(fuzz::write_scratch("m.model", bytes));
  const auto ids = tok.encode("In the beginning \xe2\x80\x94 caf\xc3\xa9 42");
  for (int id : ids) {
    if (id < 0 || id >= tok.vocab_size()) throw fuzz::BadAccept("an id outside the vocabulary");
  }
  tok.decode(ids);
}

const std::vector<std::string> kChatWords{"\"messages\"", "\"role\"", "\"content\"", "\"user\"", "\"assistant\"",
                                          "\"system\"", "\"prompt\"", "\"chosen\"", "\"rejected\"", "<|end|>",
                                          "<|user|>", "\\u0000", "\\ud800", "\\n"};

}  // namespace

int main(int argc, char** argv) {
  std::vector<fuzz::Target> t(7);
  t[0].name = "shard";
  t[0].seeds = {valid_shard(2), valid_shard(4)};
  t[0].dictionary = {"MTSHARD1"};
  t[0].run = check_shard;
  t[1].name = "documents";
  t[1].dictionary = {"\"text\"", "\\u0000", "\\ud800", "\n"};
  t[1].mutate = fuzz::mutate_jsonl;
  t[1].run = check_documents;
  t[2].name = "chat";
  t[2].dictionary = kChatWords;
  t[2].mutate = fuzz::mutate_jsonl;
  t[2].run = [](const std::string& s) { check_chats(s, false); };
  t[3].name = "prefs";
  t[3].dictionary = kChatWords;
  t[3].mutate = fuzz::mutate_jsonl;
  t[3].run = [](const std::string& s) { check_chats(s, true); };
  t[4].name = "task";
  t[4].dictionary = {"\"prompt\"", "\"answer\"", "\\u0000", "+", "="};
  t[4].mutate = fuzz::mutate_jsonl;
  t[4].run = check_tasks;
  t[5].name = "choice";
  t[5].dictionary = {"\"context\"", "\"choices\"", "\"answer\"", "\"prompt\""};
  t[5].mutate = fuzz::mutate_jsonl;
  t[5].run = check_choices;
  t[6].name = "tokenizer_model";
  tokenizer();  // trains the model the seed is
  t[6].seeds = {fuzz::read_file((fs::path(fuzz::scratch()) / "sp.model").string())};
  t[6].run = check_tokenizer_model;
  return fuzz::run_targets(argc, argv, std::move(t));
}
