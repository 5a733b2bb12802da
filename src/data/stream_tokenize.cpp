#include "meshtrain/data/stream_tokenize.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>

#include "meshtrain/data/shard.h"
#include "meshtrain/data/tokenize.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// --- Pipes: whole writes and reads, framed by 64-bit lengths. ---

void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw std::runtime_error(fmt::format("tokenizer worker pipe: write failed ({})", std::strerror(errno)));
    p += k, n -= static_cast<size_t>(k);
  }
}
bool read_all(int fd, void* data, size_t n) {  // false at end of input before any byte
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw std::runtime_error(fmt::format("tokenizer worker pipe: read failed ({})", std::strerror(errno)));
    if (k == 0) {
      if (got == 0) return false;
      throw std::runtime_error("tokenizer worker pipe: cut short (a worker died)");
    }
    got += static_cast<size_t>(k);
  }
  return true;
}
void write_u64(int fd, uint64_t v) { write_all(fd, &v, 8); }
uint64_t read_u64(int fd) {
  uint64_t v = 0;
  if (!read_all(fd, &v, 8)) throw std::runtime_error("tokenizer worker pipe: closed (a worker died)");
  return v;
}

using Ids = std::vector<uint32_t>;

// A worker: chunks of documents in, their ids out, until its input closes.
[[noreturn]] void worker_main(int in, int out, const std::string& model) {
  try {
    const Tokenizer tok(model);
    uint64_t count = 0;
    while (read_all(in, &count, 8)) {
      std::vector<std::string> docs(count);
      for (auto& d : docs) {
        d.resize(read_u64(in));
        if (!d.empty()) read_all(in, d.data(), d.size());
      }
      // The whole chunk first, then its ids: writing as it goes would block on a full pipe while the
      // parent still reads the chunk before this one, and the workers would take turns instead of overlapping.
      std::vector<std::vector<int>> ids;
      for (const auto& d : docs) ids.push_back(tok.encode(d));
      for (const auto& one : ids) {
        write_u64(out, one.size());
        if (!one.empty()) write_all(out, one.data(), one.size() * sizeof(int));
      }
    }
    ::_exit(0);
  } catch (const std::exception& e) {
    fmt::print(stderr, "meshtrain tokenize stream: worker: {}\n", e.what());
    ::_exit(1);
  }
}

// Chunks of documents encoded in order, by `workers` processes (or here, for one).
class Encoder {
 public:
  Encoder(const std::string& model, int workers) : local_(workers <= 1 ? std::make_unique<Tokenizer>(model) : nullptr) {
    for (int w = 0; local_ == nullptr && w < workers; ++w) {
      int down[2], up[2];
      if (::pipe(down) != 0 || ::pipe(up) != 0) throw std::runtime_error("pipe failed");
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        ::close(down[1]);
        ::close(up[0]);
        for (const auto& p : procs_) ::close(p.to), ::close(p.from);  // the siblings' pipes
        worker_main(down[0], up[1], model);
      }
      ::close(down[0]);
      ::close(up[1]);
      procs_.push_back({pid, down[1], up[0]});
    }
  }
  ~Encoder() {
    for (auto& p : procs_) {
      ::close(p.to);
      ::close(p.from);
      int status = 0;
      ::waitpid(p.pid, &status, 0);
    }
  }
  int slots() const { return local_ ? 1 : static_cast<int>(procs_.size()); }
  // Chunk number `n` goes to worker n % slots(); results come back in the order sent.
  void send(uint64_t n, std::vector<std::string> docs) {
    if (local_) {
      pending_ = std::move(docs);
      return;
    }
    const Proc& p = procs_[n % procs_.size()];
    write_u64(p.to, docs.size());
    for (const auto& d : docs) {
      write_u64(p.to, d.size());
      write_all(p.to, d.data(), d.size());
    }
    sizes_[n % procs_.size()] = docs.size();
  }
  std::vector<Ids> receive(uint64_t n) {
    std::vector<Ids> out;
    if (local_) {
      for (const auto& d : pending_) {
        const std::vector<int> ids = local_->encode(d);
        out.emplace_back(ids.begin(), ids.end());
      }
      pending_.clear();
      return out;
    }
    const Proc& p = procs_[n % procs_.size()];
    for (uint64_t i = 0; i < sizes_[n % procs_.size()]; ++i) {
      std::vector<int> ids(read_u64(p.from));
      if (!ids.empty()) {
        if (!read_all(p.from, ids.data(), ids.size() * sizeof(int))) throw std::runtime_error("a worker died");
      }
      out.emplace_back(ids.begin(), ids.end());
    }
    return out;
  }

 private:
  struct Proc {
    pid_t pid;
    int to, from;
  };
  std::unique_ptr<Tokenizer> local_;
  std::vector<std::string> pending_;
  std::vector<Proc> procs_;
  std::map<uint64_t, uint64_t> sizes_;
};

// What a run's shards come from: a resumed run must match it.
nlohmann::json signature(const StreamTokenizeOptions& o, const std::string& tokenizer) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& p : o.inputs) {
    std::error_code ec;
    const auto t = fs::last_write_time(p, ec).time_since_epoch().count();
    inputs.push_back({{"path", fs::absolute(p).string()}, {"bytes", fs::file_size(p, ec)}, {"mtime", t}});
  }
  std::error_code ec;
  return {{"inputs", inputs},
          {"format", o.format.format},
          {"field", o.format.field},
          {"split", o.format.split},
          {"tokenizer_bytes", fs::file_size(tokenizer, ec)},
          {"val_fraction", o.val_fraction},
          {"shard_tokens", o.shard_tokens}};
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << j.dump(2) << "\n";
  fs::rename(tmp, path);
}

std::string shard_name(const std::string& split, int64_t i) { return fmt::format("{}-{:05d}.bin", split, i); }

}  // namespace

StreamTokenizeReport stream_tokenize(const StreamTokenizeOptions& o) {
  if (o.out_dir.empty()) throw std::invalid_argument("tokenize stream: give --out DIR");
  if (o.workers < 1) throw std::invalid_argument(fmt::format("--workers {} must be at least 1", o.workers));
  if (o.shard_tokens < 1) throw std::invalid_argument(fmt::format("--shard-tokens {} must be positive", o.shard_tokens));
  if (o.tokenizer.empty() && o.sample_bytes < 1) {
    throw std::invalid_argument(fmt::format("--sample-bytes {} must be positive: the tokenizer trains on that much text",
                                            o.sample_bytes));
  }
  if (o.chunk_bytes < 1) throw std::invalid_argument(fmt::format("--chunk-bytes {} must be positive", o.chunk_bytes));
  if (o.val_fraction < 0 || o.val_fraction >= 1) {
    throw std::invalid_argument(fmt::format("--val-fraction {} must be in [0, 1)", o.val_fraction));
  }
  if (o.tokenizer.empty() && (o.vocab_size < 320 || o.vocab_size > (1 << 20))) {
    throw std::invalid_argument(fmt::format("--vocab-size {} must be in 320..1048576", o.vocab_size));
  }
  if (!o.tokenizer.empty() && !fs::is_regular_file(o.tokenizer)) {
    throw std::invalid_argument(fmt::format("tokenizer {} does not exist", o.tokenizer));
  }
  const fs::path dir(o.out_dir);
  const fs::path progress_path = dir / "progress.json", index_path = dir / "index.json";
  if (fs::exists(index_path) && !o.force) {
    throw std::invalid_argument(fmt::format("{} holds a finished tokenization ({}); pass --force to redo it", o.out_dir,
                                            index_path.string()));
  }
  // Pass 1: the documents (and every input checked before anything is written).
  StreamTokenizeReport r;
  {
    DocumentReader count(o.inputs, o.format);
    Document d;
    while (count.next(d)) ++r.documents;
  }
  if (r.documents == 0) throw std::invalid_argument(fmt::format("the corpus ({}) has no text", fmt::join(o.inputs, ", ")));
  const int64_t n_val = validation_documents(r.documents, o.val_fraction);
  if (n_val >= r.documents) {
    throw std::invalid_argument(fmt::format("the corpus has {} document(s): --val-fraction {} would take every one",
                                            r.documents, o.val_fraction));
  }
  fs::create_directories(dir);
  // The tokenizer: given, kept from an interrupted run, or trained on the first sample_bytes of the documents.
  r.tokenizer_path = o.tokenizer.empty() ? (dir / "tokenizer.model").string() : o.tokenizer;
  nlohmann::json progress;
  if (fs::exists(progress_path) && !o.force) std::ifstream(progress_path) >> progress;
  if (progress.is_null() && o.force) {
    for (const auto& e : fs::directory_iterator(dir)) {  // another run's shards: start over
      const std::string name = e.path().filename().string();
      if (name.rfind("train-", 0) == 0 || name.rfind("val-", 0) == 0 || name == "index.json") fs::remove(e.path());
    }
  }
  if (o.tokenizer.empty() && (progress.is_null() || !fs::exists(r.tokenizer_path))) {
    const std::string tag = fmt::format(".tmp-{}", ::getpid());
    const fs::path sample = dir / ("tokenizer-sample.txt" + tag), prefix = dir / ("tokenizer" + tag);
    {
      std::ofstream f(sample);
      DocumentReader reader(o.inputs, o.format);
      Document d;
      int64_t written = 0;
      while (written < o.sample_bytes && reader.next(d)) {
        for (char& ch : d.text) ch = ch == '\n' ? ' ' : ch;  // a line is a sentence to the trainer
        f << d.text << "\n";
        written += static_cast<int64_t>(d.text.size()) + 1;
      }
    }
    try {
      train_tokenizer({sample.string()}, prefix.string(), o.vocab_size);
    } catch (...) {
      fs::remove(sample);
      throw;
    }
    fs::remove(sample);
    fs::rename(prefix.string() + ".model", dir / "tokenizer.model");
    fs::rename(prefix.string() + ".vocab", dir / "tokenizer.vocab");
    progress = nullptr;
  }
  const nlohmann::json sig = signature(o, r.tokenizer_path);
  int64_t done = 0, shards[2] = {0, 0};  // documents in written shards; shards written per split
  if (!progress.is_null()) {
    if (progress.at("signature") != sig) {
      throw std::invalid_argument(fmt::format("{} holds an interrupted tokenization of other inputs or options ({}); "
                                              "rerun it with the same ones, or pass --force to start over",
                                              o.out_dir, progress_path.string()));
    }
    done = progress.at("documents").get<int64_t>();
    shards[0] = progress.at("train_shards").get<int64_t>();
    shards[1] = progress.at("val_shards").get<int64_t>();
    r.train_tokens = progress.at("train_tokens").get<int64_t>();
    r.val_tokens = progress.at("val_tokens").get<int64_t>();
    r.resumed_documents = done;
  }
  // Pass 2: encode, in chunks, in order; a shard is written when the next document would not fit.
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer probe(r.tokenizer_path);
  const uint32_t eos = static_cast<uint32_t>(probe.eos_id());
  const int width = probe.vocab_size() <= 65536 ? 2 : 4;
  Encoder encoder(r.tokenizer_path, o.workers);
  DocumentReader reader(o.inputs, o.format);
  int64_t index = 0;  // the next document read
  Document d;
  for (; index < done && reader.next(d); ++index) {
  }
  Ids tokens;
  std::vector<uint64_t> starts;
  int64_t first_in_shard = done;  // the document that opens the current shard
  auto close_shard = [&](int split, int64_t next_document) {
    if (tokens.empty()) return;
    write_shard((dir / shard_name(split ? "val" : "train", shards[split])).string(), tokens, starts, width);
    (split ? r.val_tokens : r.train_tokens) += static_cast<int64_t>(tokens.size());
    shards[split] += 1;
    tokens.clear();
    starts.clear();
    first_in_shard = next_document;
    write_json(progress_path, {{"signature", sig}, {"documents", next_document}, {"train_shards", shards[0]},
                               {"val_shards", shards[1]}, {"train_tokens", r.train_tokens}, {"val_tokens", r.val_tokens}});
    if (o.exit_after_shards > 0 && shards[0] + shards[1] >= o.exit_after_shards) ::_exit(3);
  };
  auto add = [&](int64_t doc, const Ids& ids) {
    const int split = doc >= r.documents - n_val ? 1 : 0;
    if (split == 1 && doc == r.documents - n_val) close_shard(0, doc);  // the training documents end here
    const uint64_t n = ids.size() + 1;
    if (!tokens.empty() && tokens.size() + n > static_cast<uint64_t>(o.shard_tokens)) close_shard(split, doc);
    starts.push_back(tokens.size());
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.push_back(eos);
  };
  // Up to slots() chunks in flight: chunk c to worker c % slots, results taken in order.
  uint64_t sent = 0, received = 0;
  std::map<uint64_t, int64_t> chunk_first;  // chunk -> its first document
  bool more = true;
  auto send_next = [&]() {
    std::vector<std::string> docs;
    int64_t bytes = 0;
    const int64_t first = index;
    while (bytes < o.chunk_bytes && reader.next(d)) {
      bytes += static_cast<int64_t>(d.text.size());
      docs.push_back(std::move(d.text));
      ++index;
    }
    if (docs.empty()) {
      more = false;
      return;
    }
    chunk_first[sent] = first;
    encoder.send(sent++, std::move(docs));
  };
  for (int s = 0; s < encoder.slots() && more; ++s) send_next();
  while (received < sent) {
    const uint64_t c = received++;
    const std::vector<Ids> ids = encoder.receive(c);
    int64_t doc = chunk_first[c];
    chunk_first.erase(c);
    if (more) send_next();  // the freed worker takes the next chunk while this one is written
    for (const auto& one : ids) add(doc++, one);
  }
  close_shard(n_val > 0 && first_in_shard >= r.documents - n_val ? 1 : 0, r.documents);
  r.bytes = reader.bytes_read();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int64_t i = 0; i < shards[0]; ++i) r.train_shards.push_back((dir / shard_name("train", i)).string());
  for (int64_t i = 0; i < shards[1]; ++i) r.val_shards.push_back((dir / shard_name("val", i)).string());
  write_json(index_path, {{"train", r.train_shards}, {"val", r.val_shards}, {"documents", r.documents},
                          {"train_tokens", r.train_tokens}, {"val_tokens", r.val_tokens},
                          {"tokenizer", r.tokenizer_path}});
  fs::remove(progress_path);
  return r;
}

}  // namespace meshtrain
