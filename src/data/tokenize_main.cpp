// meshtrain-tokenize: the tokenizer's own process (see CMakeLists.txt: it must
// not share a process with libtorch). `meshtrain tokenize` runs it with the same
// arguments:
//   --input FILE (repeatable) --out DIR [--vocab-size N] [--tokenizer MODEL]
//   [--val-fraction F] [--blank-line-documents] [--force]
// and, for `meshtrain sample`:
//   encode --tokenizer MODEL --text TEXT     prints the ids, space-separated
//   decode --tokenizer MODEL --ids "1 2 3"   prints the text (end-of-sequence: a new line)
//   vocab --tokenizer MODEL                  prints the number of pieces
//   special --tokenizer MODEL                "vocab N" and "unk|bos|eos ID PIECE" lines
// and, for large corpora (data/stream_tokenize.h):
//   stream --input FILE... --out DIR [--tokenizer MODEL | --vocab-size N --sample-bytes B] [--workers W]
//          [--shard-tokens T] [--chunk-bytes C] [--val-fraction F] [--format auto|text|jsonl] [--field text]
//          [--split line|blank-line|file] [--force]
//        writes DIR/train-00000.bin ... val-00000.bin ... and DIR/index.json; resumes an interrupted run
// and, for supervised fine-tuning (data/chat.h):
//   chat --input CHATS.jsonl --tokenizer MODEL --out DIR --seq N [--truncate] [--no-pack] [--force]
//        (--no-pack: one conversation per block, the rest padding)
//        writes DIR/train.bin, DIR/train.mask.bin (1 = trained target) and DIR/sft.json
// and, for reinforcement learning's shipped tasks (data/tasks.h, their own character vocabulary):
//   task --name arithmetic|reverse --out DIR --seq N [--digits D] [--count N] [--seed S] [--force]
//        writes DIR/train.bin, train.mask.bin, sft.json (SFT on prompt -> answer), DIR/prefs/ (the
//        same prompts as preference pairs: the answer chosen, a near miss rejected; for a reward model
//        or DPO), DIR/prompts.jsonl (RL prompts, another seed) and DIR/eval.jsonl (held out: in neither),
//        each line {"prompt", "answer"}
// and, for multiple-choice evaluation (data/choice_task.h, train/choice_eval.h):
//   choices --input TASK.jsonl --tokenizer MODEL     prints each question's ids as a JSON line
// and, for DPO (data/preference.h):
//   prefs --input PAIRS.jsonl --tokenizer MODEL --out DIR --seq N [--truncate] [--force]
//        writes DIR/train.bin, DIR/train.mask.bin and DIR/dpo.json (two blocks per pair)
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/chat.h"
#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/preference.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/data/stream_tokenize.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/data/tokenize.h"

namespace {

// The value after option argv[i] (i moves past it).
std::string option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", argv[i]));
  return argv[++i];
}

// Option `name`'s value `v` as a whole number.
int64_t whole_number(const std::string& name, const std::string& v) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
  }
  if (used == 0 || used != v.size()) throw std::invalid_argument(fmt::format("{} '{}' is not a whole number", name, v));
  return n;
}

// `chat` (SFT conversations) and `prefs` (DPO pairs): the same options and files.
int chat(int argc, char** argv) {
  const bool prefs = std::string(argv[1]) == "prefs";
  const char* what = prefs ? "prefs" : "chat";
  std::string input, model, out;
  int64_t seq = 0;
  bool truncate = false, force = false, no_pack = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--input") input = value();
    else if (a == "--tokenizer") model = value();
    else if (a == "--out") out = value();
    else if (a == "--seq") {
      const std::string v = value();
      size_t used = 0;
      try {
        seq = std::stoll(v, &used);
      } catch (const std::exception&) {
      }
      if (used == 0 || used != v.size()) throw std::invalid_argument(fmt::format("--seq '{}' is not a whole number", v));
    }
    else if (a == "--truncate") truncate = true;
    else if (a == "--no-pack") no_pack = true;
    else if (a == "--force") force = true;
    else throw std::invalid_argument(fmt::format("{}: unknown option '{}'", what, a));
  }
  if (input.empty() || model.empty() || out.empty() || seq < 2) {
    throw std::invalid_argument(fmt::format("{} needs --input {}.jsonl --tokenizer MODEL --out DIR --seq N (N >= 2)",
                                            what, prefs ? "PAIRS" : "CHATS"));
  }
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(out) / "train.bin") && !force) {
    throw std::invalid_argument(fmt::format("{} already holds train.bin; pass --force to replace it", out));
  }
  const meshtrain::Tokenizer tok(model);
  const std::vector<meshtrain::TokenizedChat> chats =
      meshtrain::read_chats(input, prefs, [&](const std::string& text) { return tok.encode(text); });
  const uint32_t pad = static_cast<uint32_t>(tok.eos_id());
  const meshtrain::PackedChats p =
      prefs ? meshtrain::pack_pairs(chats, seq, pad, truncate) : meshtrain::pack_chats(chats, seq, pad, truncate, no_pack);
  fs::create_directories(out);
  const int width = tok.vocab_size() <= 65536 ? 2 : 4;
  meshtrain::write_shard((fs::path(out) / "train.bin").string(), p.tokens, p.doc_starts, width);
  meshtrain::write_shard((fs::path(out) / "train.mask.bin").string(), p.mask, p.doc_starts, 2);
  const double padding = static_cast<double>(p.padding) / static_cast<double>(p.tokens.size() - 1);
  nlohmann::json info{{"seq", seq}, {"conversations", p.conversations}, {"tokens", p.tokens.size()},
                      {"trained_tokens", p.trained}, {"padding_tokens", p.padding},
                      {"padding_fraction", padding}, {"truncated", p.truncated}, {"tokenizer", model},
                      {"input", input}};
  if (prefs) info["pairs"] = p.conversations / 2;
  std::ofstream(fs::path(out) / (prefs ? "dpo.json" : "sft.json")) << info.dump(2) << "\n";
  fmt::print("{} {} -> {} blocks of {} tokens in {}: {} trained tokens, padding {:.1f}%{}\n",
             prefs ? p.conversations / 2 : p.conversations, prefs ? "pairs" : "conversations",
             (p.tokens.size() - 1) / static_cast<uint64_t>(seq), seq, out, p.trained, 100 * padding,
             p.truncated ? fmt::format(", {} truncated", p.truncated) : "");
  return 0;
}

int task(int argc, char** argv) {
  std::string name, out;
  int64_t seq = 0, count = 4000, digits = 2, seed = 1;
  bool force = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() { return option_value(argc, argv, i); };
    auto whole = [&](const std::string& v) { return whole_number(a, v); };
    if (a == "--name") name = value();
    else if (a == "--out") out = value();
    else if (a == "--seq") seq = whole(value());
    else if (a == "--count") count = whole(value());
    else if (a == "--digits") digits = whole(value());
    else if (a == "--seed") seed = whole(value());
    else if (a == "--force") force = true;
    else throw std::invalid_argument(fmt::format("task: unknown option '{}'", a));
  }
  if (name.empty() || out.empty() || seq < 2 || count < 1) {
    throw std::invalid_argument("task needs --name arithmetic|reverse --out DIR --seq N (N >= 2) [--count N >= 1]");
  }
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(out) / "train.bin") && !force) {
    throw std::invalid_argument(fmt::format("{} already holds train.bin; pass --force to replace it", out));
  }
  using meshtrain::CharVocab;
  std::vector<meshtrain::TokenizedChat> chats;
  int64_t line = 0;
  const meshtrain::TaskSplit split =
      meshtrain::task_split(name, static_cast<uint64_t>(seed), count, static_cast<int>(digits));
  // The prompt (not trained), then the answer and the end token (trained).
  auto sequence = [&](const std::string& prompt, const std::string& answer) {
    meshtrain::TokenizedChat c;
    c.line = ++line;
    for (int64_t id : CharVocab::encode(prompt)) {
      c.ids.push_back(static_cast<uint32_t>(id));
      c.mask.push_back(0);
    }
    for (int64_t id : CharVocab::encode(answer + "\n")) {
      c.ids.push_back(static_cast<uint32_t>(id));
      c.mask.push_back(1);
    }
    return c;
  };
  for (const auto& e : split.train) chats.push_back(sequence(e.prompt, e.answer));
  const meshtrain::PackedChats p = meshtrain::pack_chats(chats, seq, static_cast<uint32_t>(CharVocab::end()), false);
  fs::create_directories(out);
  meshtrain::write_shard((fs::path(out) / "train.bin").string(), p.tokens, p.doc_starts, 2);
  meshtrain::write_shard((fs::path(out) / "train.mask.bin").string(), p.mask, p.doc_starts, 2);
  const nlohmann::json info{{"seq", seq}, {"conversations", p.conversations}, {"tokens", p.tokens.size()},
                            {"trained_tokens", p.trained}, {"padding_tokens", p.padding},
                            {"padding_fraction", static_cast<double>(p.padding) / static_cast<double>(p.tokens.size() - 1)},
                            {"truncated", 0}, {"task", name}, {"digits", digits}, {"vocab", CharVocab::size()}};
  std::ofstream(fs::path(out) / "sft.json") << info.dump(2) << "\n";
  // Preference pairs (data/preference.h's layout) for a reward model or DPO:
  // the right answer chosen, a near miss rejected.
  std::vector<meshtrain::TokenizedChat> pairs;
  line = 0;
  for (size_t i = 0; i < split.train.size(); ++i) {
    const auto& e = split.train[i];
    pairs.push_back(sequence(e.prompt, e.answer));
    pairs.push_back(sequence(e.prompt, meshtrain::near_miss(e, static_cast<uint64_t>(seed) * 1000003 + i)));
  }
  const meshtrain::PackedChats pp = meshtrain::pack_pairs(pairs, seq, static_cast<uint32_t>(CharVocab::end()), false);
  fs::create_directories(fs::path(out) / "prefs");
  meshtrain::write_shard((fs::path(out) / "prefs/train.bin").string(), pp.tokens, pp.doc_starts, 2);
  meshtrain::write_shard((fs::path(out) / "prefs/train.mask.bin").string(), pp.mask, pp.doc_starts, 2);
  std::ofstream(fs::path(out) / "prefs/dpo.json")
      << nlohmann::json{{"seq", seq}, {"pairs", pp.conversations / 2}, {"task", name}, {"vocab", CharVocab::size()}}.dump(2)
      << "\n";
  // RL prompts and held-out evaluation: other seeds; no evaluation prompt is trained on.
  for (const auto& [file, examples] : {std::pair{"prompts.jsonl", &split.prompts}, {"eval.jsonl", &split.eval}}) {
    std::ofstream f(fs::path(out) / file);
    for (const auto& e : *examples) f << nlohmann::json{{"prompt", e.prompt}, {"answer", e.answer}}.dump() << "\n";
  }
  fmt::print("task {}: {} examples -> {} blocks of {} tokens in {} (vocabulary {}); {} preference pairs in prefs/; "
             "prompts.jsonl {}, eval.jsonl {} (held out: in neither)\n",
             name, split.train.size(), (p.tokens.size() - 1) / static_cast<uint64_t>(seq), seq, out, CharVocab::size(),
             pp.conversations / 2, split.prompts.size(), split.eval.size());
  return 0;
}

// A question's context and choices as ids, split as EleutherAI's
// lm-evaluation-harness does (lm_eval/api/model.py, _encode_pair): trailing
// spaces of the context move to the continuation, the context and the context
// followed by the choice are encoded, and the choice's ids are the whole's
// beyond the context's (so the tokenizer sees the text as one piece, as in
// training). The context is preceded by the end-of-sequence id.
int choices(int argc, char** argv) {
  std::string input, model;
  for (int i = 2; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", a));
    if (a == "--input") input = argv[i + 1];
    else if (a == "--tokenizer") model = argv[i + 1];
    else throw std::invalid_argument(fmt::format("choices: unknown option '{}'", a));
  }
  if (input.empty() || model.empty()) throw std::invalid_argument("choices needs --input TASK.jsonl --tokenizer MODEL");
  const auto items = meshtrain::read_choice_task(input);
  const meshtrain::Tokenizer tok(model);
  auto ids = [&](const std::string& text) {
    std::vector<int64_t> out;
    for (int id : tok.encode(text)) out.push_back(id);
    return out;
  };
  for (const auto& item : items) {
    meshtrain::TokenizedChoice q;
    q.answer = item.answer;
    q.line = item.line;
    const size_t kept = item.context.find_last_not_of(' ') + 1;  // npos + 1 = 0: all spaces
    const std::string context = item.context.substr(0, kept), spaces = item.context.substr(kept);
    const std::vector<int64_t> context_ids = ids(context);
    q.context = {tok.eos_id()};
    q.context.insert(q.context.end(), context_ids.begin(), context_ids.end());
    for (const auto& choice : item.choices) {
      const std::vector<int64_t> whole = ids(context + spaces + choice);
      std::vector<int64_t> continuation;
      if (whole.size() > context_ids.size()) continuation.assign(whole.begin() + static_cast<int64_t>(context_ids.size()), whole.end());
      if (continuation.empty()) {
        throw std::invalid_argument(fmt::format("{}:{}: the choice \"{}\" adds no tokens to its context", input,
                                                item.line, choice));
      }
      q.choices.push_back(std::move(continuation));
      q.chars.push_back(meshtrain::utf8_length(choice));
    }
    fmt::print("{}\n", meshtrain::tokenized_choice_line(q));
  }
  return 0;
}

int stream(int argc, char** argv) {
  meshtrain::StreamTokenizeOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() { return option_value(argc, argv, i); };
    auto whole = [&](const std::string& v) { return whole_number(a, v); };
    if (a == "--input") o.inputs.push_back(value());
    else if (a == "--out") o.out_dir = value();
    else if (a == "--tokenizer") o.tokenizer = value();
    else if (a == "--vocab-size") o.vocab_size = static_cast<int>(whole(value()));
    else if (a == "--sample-bytes") o.sample_bytes = whole(value());
    else if (a == "--workers") o.workers = static_cast<int>(whole(value()));
    else if (a == "--shard-tokens") o.shard_tokens = whole(value());
    else if (a == "--chunk-bytes") o.chunk_bytes = whole(value());
    else if (a == "--val-fraction") {
      const std::string v = value();
      size_t used = 0;
      try {
        o.val_fraction = std::stod(v, &used);
      } catch (const std::exception&) {
      }
      if (used == 0 || used != v.size()) throw std::invalid_argument(fmt::format("--val-fraction '{}' is not a number", v));
    }
    else if (a == "--format") o.format.format = value();
    else if (a == "--field") o.format.field = value();
    else if (a == "--split") o.format.split = value();
    else if (a == "--force") o.force = true;
    else throw std::invalid_argument(fmt::format("stream: unknown option '{}'", a));
  }
  if (o.inputs.empty()) throw std::invalid_argument("stream needs --input FILE (repeatable) --out DIR");
  if (const char* stop = std::getenv("MESHTRAIN_TOKENIZE_EXIT_AFTER_SHARDS")) o.exit_after_shards = std::atoll(stop);
  const meshtrain::StreamTokenizeReport r = meshtrain::stream_tokenize(o);
  fmt::print("tokenizer {}\n", r.tokenizer_path);
  if (r.resumed_documents > 0) fmt::print("resumed after {} documents already written\n", r.resumed_documents);
  // This process's peak resident memory (VmHWM: since exec, unlike getrusage's maxrss, which keeps the
  // forking parent's); each worker's own comes on top.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) fmt::print("peak resident memory {} kB\n", std::stoll(line.substr(6)));
  }
  fmt::print("{} documents, {} bytes -> {} train tokens in {} shard(s), {} validation tokens in {} shard(s) ({}); "
             "encoded in {:.2f} s ({:.2f} MB/s, {} worker(s))\n",
             r.documents, r.bytes, r.train_tokens, r.train_shards.size(), r.val_tokens, r.val_shards.size(), o.out_dir,
             r.seconds, static_cast<double>(r.bytes) / 1e6 / std::max(r.seconds, 1e-9), o.workers);
  return 0;
}

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
  if (mode == "special") {  // what a Hugging Face export writes (ckpt/hf.h): "vocab N", then "NAME ID PIECE" lines
    fmt::print("vocab {}\n", tok.vocab_size());
    for (auto [name, id] : {std::pair{"unk", tok.unk_id()}, {"bos", tok.bos_id()}, {"eos", tok.eos_id()}}) {
      fmt::print("{} {} {}\n", name, id, tok.piece(id));
    }
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
    if (argc > 1 && (std::string(argv[1]) == "chat" || std::string(argv[1]) == "prefs")) return chat(argc, argv);
    if (argc > 1 && std::string(argv[1]) == "task") return task(argc, argv);
    if (argc > 1 && std::string(argv[1]) == "choices") return choices(argc, argv);
    if (argc > 1 && std::string(argv[1]) == "stream") return stream(argc, argv);
    if (argc > 1 && (std::string(argv[1]) == "encode" || std::string(argv[1]) == "decode" ||
                     std::string(argv[1]) == "vocab" || std::string(argv[1]) == "special")) {
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
