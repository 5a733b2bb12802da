// Saving a sharded checkpoint (see checkpoint.h for the layout and invariants).
#include "meshtrain/ckpt/checkpoint.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <sys/file.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <stdexcept>

#include "ckpt/files.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/platform/crash_point.h"

namespace fs = std::filesystem;

namespace meshtrain::ckpt {
namespace {

std::string rank_file(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
std::string part_file(int rank) { return fmt::format("rank_{:05d}.part.json", rank); }

// Every rank's `mine`, in rank order (collective; two all-gathers).
std::vector<std::string> all_gather_strings(Comm& group, const std::string& mine) {
  const int n = group.size();
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong), lens = at::zeros({n}, at::kLong);
  group.all_gather(lens, len, GatherAlgo::Broadcast);
  const int64_t width = std::max<int64_t>(1, lens.max().item<int64_t>());
  at::Tensor in = at::zeros({width}, at::kByte), out = at::zeros({n * width}, at::kByte);
  std::memcpy(in.data_ptr(), mine.data(), mine.size());
  group.all_gather(out, in, GatherAlgo::Broadcast);
  std::vector<std::string> all;
  for (int r = 0; r < n; ++r) {
    all.emplace_back(static_cast<const char*>(out.data_ptr()) + r * width, lens[r].item<int64_t>());
  }
  return all;
}

// Removes `path` and everything under it, ignoring errors (best effort: a
// leftover is swept by the next Checkpointer on this directory).
void remove_quietly(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Deletes a checkpoint directory without ever leaving one that looks whole
// or half-deleted under its own name: rename first, then delete.
void retire(const fs::path& dir) {
  const fs::path doomed = dir.parent_path() / fmt::format(".del-{}-{}", dir.filename().string(), ::getpid());
  fs::rename(dir, doomed);
  fsync_dir(dir.parent_path().string());
  crash_point("ckpt.retire_renamed");
  remove_quietly(doomed);
}

// Leftovers of crashed or failed saves and retentions (only while holding the lock).
// A `.old-step_N` without a `step_N` is the only copy of step N (a crash
// between finalize's two renames): it is restored, not swept.
int sweep(const std::string& dir) {
  std::vector<fs::path> olds;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(".old-step_", 0) == 0) olds.push_back(e.path());
  }
  for (const fs::path& old : olds) {
    const fs::path step_dir = fs::path(dir) / old.filename().string().substr(5);
    if (fs::exists(old / "manifest.json") && !fs::exists(step_dir)) {
      fs::rename(old, step_dir);
      fsync_dir(dir);
    }
  }
  int swept = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    int64_t step = 0;
    const bool stale = n.rfind(".tmp-step_", 0) == 0 || n.rfind(".del-step_", 0) == 0 ||
                       n.rfind(".old-step_", 0) == 0 ||
                       (parse_step_dir(n, step) && e.is_directory() && !fs::exists(e.path() / "manifest.json"));
    if (!stale) continue;
    remove_quietly(e.path());
    ++swept;
  }
  return swept;
}

}  // namespace

struct Checkpointer::Pending {
  int64_t step = 0;
  std::string tmp;
  nlohmann::json global;
  std::thread thread;           // async: this rank's writer
  std::atomic<bool> done{false};
  std::string error;            // this rank's writer's failure ("" = none), read once done
};

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

void check_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::invalid_argument(fmt::format("checkpoint.dir {} cannot be created: {}; choose a writable directory",
                                            dir, ec.message()));
  }
  const std::string probe = (fs::path(dir) / fmt::format(".probe-{}", ::getpid())).string();
  try {
    write_file_atomic(probe, "meshtrain checks that checkpoints can be written here\n");
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("checkpoint.dir {} is not writable ({}); choose a writable directory",
                                            dir, e.what()));
  }
  fs::remove(probe, ec);
  const std::string lock = (fs::path(dir) / ".lock").string();
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);  // no lock file: no job holds it (and none is made here)
  if (fd < 0) return;  // absent, or the Checkpointer reports it
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  if (held) {
    throw std::invalid_argument(fmt::format("checkpoint.dir {} is in use by another running job ({}); give each job "
                                            "its own checkpoint.dir",
                                            dir, read_file(lock)));
  }
}

Checkpointer::Checkpointer(SaveOptions o, std::unique_ptr<Comm> group)
    : owned_(std::move(group)), o_(std::move(o)), group_(*owned_) {
  open();
}

Checkpointer::Checkpointer(SaveOptions o, Comm& group) : o_(std::move(o)), group_(group) { open(); }

void Checkpointer::open() {
  if (o_.dir.empty()) throw std::invalid_argument("checkpoint directory is empty; set checkpoint.dir");
  if (o_.keep < 1) throw std::invalid_argument(fmt::format("checkpoint.keep = {} must be at least 1", o_.keep));
  // Rank 0 takes the lock (released by the kernel when the process dies, so
  // a crashed job never blocks the next) and sweeps; the others learn the outcome.
  std::string error;
  if (group_.rank() == 0) {
    try {
      fs::create_directories(o_.dir);
      const std::string lock = (fs::path(o_.dir) / ".lock").string();
      lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (lock_fd_ < 0) throw std::runtime_error(fmt::format("cannot open {}: {}", lock, std::strerror(errno)));
      // A launching process's probe (check_directory) holds the lock for a moment: try for a second.
      int locked = -1;
      for (int i = 0; i < 50 && (locked = ::flock(lock_fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EWOULDBLOCK; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (locked != 0 && errno != EWOULDBLOCK) {
        throw std::runtime_error(fmt::format("cannot lock {}: {}", lock, std::strerror(errno)));
      }
      if (locked != 0) {
        const std::string holder = read_file(lock);
        throw std::runtime_error(fmt::format("checkpoint.dir {} is in use by another running job ({}); give each job "
                                             "its own checkpoint.dir",
                                             o_.dir, holder.empty() ? "holder unknown" : holder));
      }
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      const std::string me = fmt::format("pid {} on {}", ::getpid(), host);
      if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
        throw std::runtime_error(fmt::format("cannot write {}: {}", lock, std::strerror(errno)));
      }
      sweep(o_.dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string agreed = all_gather_strings(group_, error)[0];
  if (!agreed.empty()) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw std::runtime_error(agreed);
  }
}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
  if (pending_) {
    fmt::print(stderr, "checkpoint step {} was not completed (the run stopped first); {} is removed by the next run\n",
               pending_->step, pending_->tmp);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Checkpointer::save(int64_t step, std::vector<Piece> pieces, nlohmann::json global, nlohmann::json rank_state) {
  finish();
  // A nonce names this attempt's temporary directory, so files of an earlier
  // crashed attempt at the same step are never mistaken for ours.
  at::Tensor nonce = at::zeros({1}, at::kLong);
  if (group_.rank() == 0) nonce[0] = static_cast<int64_t>(std::random_device{}() >> 1) << 20 | (step & 0xfffff);
  group_.broadcast(nonce, 0, Transport::Native);
  pending_ = std::make_unique<Pending>();
  Pending& p = *pending_;
  p.step = step;
  p.tmp = (fs::path(o_.dir) / fmt::format(".tmp-{}-{:x}", step_dir_name(step), nonce.item<int64_t>())).string();
  p.global = std::move(global);
  if (!o_.async) {
    write(p, std::move(pieces), std::move(rank_state));
    agree();
    return;
  }
  // The snapshot: training may change the live tensors as soon as we return.
  for (auto& x : pieces) x.local = x.owner ? x.local.detach().clone(at::MemoryFormat::Contiguous) : at::Tensor();
  p.thread = std::thread([this, &p, pieces = std::move(pieces), rank_state = std::move(rank_state)]() mutable {
    write(p, std::move(pieces), std::move(rank_state));
  });
}

int64_t Checkpointer::poll() {
  if (!pending_) return -1;  // every rank agrees: save() and agree() are collective
  // [any writer failed, every writer done]
  at::Tensor s = at::zeros({2}, at::kLong);
  const bool done = pending_->done.load();
  s[0] = done && !pending_->error.empty() ? 1 : 0;
  s[1] = done ? 0 : 1;  // max over ranks of "still writing"
  group_.all_reduce(s, ReduceOp::Max, Transport::Native);
  if (s[0].item<int64_t>() == 0 && s[1].item<int64_t>() != 0) return -1;
  const int64_t step = pending_->step;
  agree();
  return step;
}

void Checkpointer::finish() {
  if (pending_) agree();
}

void Checkpointer::write(Pending& p, std::vector<Piece> pieces, nlohmann::json rank_state) {
  try {
    const int rank = group_.rank();
    fs::create_directories(p.tmp);
    std::vector<NamedTensor> owned;
    nlohmann::json part{{"rank", rank}, {"file", rank_file(rank)}, {"pieces", nlohmann::json::array()}, {"state", rank_state}};
    std::map<std::string, int> seen;  // a rank may hold several boxes of one tensor (ZeRO): keys tell them apart
    for (auto& x : pieces) {
      if (!x.owner) continue;
      const int k = seen[x.name]++;
      const std::string key = k == 0 ? x.name : fmt::format("{}#{}", x.name, k);
      owned.push_back({key, x.local});
      part["pieces"].push_back({{"name", x.name}, {"dtype", dtype_name(x.local.scalar_type())},
                                {"global_shape", x.global_shape}, {"offsets", x.offsets},
                                {"shape", x.local.sizes().vec()}});
      if (k > 0) part["pieces"].back()["key"] = key;
    }
    const auto sums = write_safetensors((fs::path(p.tmp) / rank_file(rank)).string(), owned);
    crash_point("ckpt.rank_file_written");
    for (size_t i = 0; i < sums.size(); ++i) part["pieces"][i]["xxh64"] = sums[i];
    write_file_atomic((fs::path(p.tmp) / part_file(rank)).string(), part.dump());
  } catch (const std::exception& e) {
    p.error = e.what();
    if (p.error.empty()) p.error = "unknown error";
  }
  p.done = true;
}

void Checkpointer::agree() {
  Pending& p = *pending_;
  if (p.thread.joinable()) p.thread.join();
  // Every rank's outcome, to every rank.
  const std::vector<std::string> errors = all_gather_strings(group_, p.error);
  std::string why;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) why += fmt::format("{}rank {}: {}", why.empty() ? "" : "; ", r, errors[r]);
  }
  if (why.empty()) {  // every rank knows this: rank 0 assembles, renames, and tells the others how it went
    std::string outcome;
    if (group_.rank() == 0) {
      try {
        finalize(p);
      } catch (const std::exception& e) {
        outcome = fmt::format("rank 0: {}", e.what());
      }
    }
    why = all_gather_strings(group_, outcome)[0];
  }
  const std::string tmp = p.tmp;
  const int64_t step = p.step;
  pending_.reset();
  if (why.empty()) return;
  // Nothing of a failed save stays: each rank removes its file, rank 0 the directory.
  remove_quietly(fs::path(tmp) / rank_file(group_.rank()));
  remove_quietly(fs::path(tmp) / part_file(group_.rank()));
  if (group_.rank() == 0) remove_quietly(tmp);
  throw std::runtime_error(fmt::format("checkpoint step {} not saved: {}", step, why));
}

void Checkpointer::finalize(const Pending& p) {
  const int world = group_.size();
  const std::string& tmp = p.tmp;
  nlohmann::json tensors = nlohmann::json::object(), ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json part = nlohmann::json::parse(read_file((fs::path(tmp) / part_file(r)).string()));
    for (const auto& x : part["pieces"]) {
      const std::string name = x["name"];
      auto& t = tensors[name];
      if (t.is_null()) t = {{"dtype", x["dtype"]}, {"shape", x["global_shape"]}, {"shards", nlohmann::json::array()}};
      if (t["dtype"] != x["dtype"] || t["shape"] != x["global_shape"]) {
        throw std::logic_error(fmt::format("checkpoint tensor '{}': ranks disagree on its dtype or global shape", name));
      }
      t["shards"].push_back({{"file", part["file"]}, {"offsets", x["offsets"]}, {"shape", x["shape"]},
                             {"xxh64", x["xxh64"]}});
      if (x.contains("key")) t["shards"].back()["key"] = x["key"];
    }
    ranks.push_back(part["state"]);
  }
  nlohmann::json manifest = p.global;
  manifest["format"] = "meshtrain-checkpoint";
  manifest["version"] = 1;
  manifest["step"] = p.step;
  manifest["world_size"] = world;
  manifest["tensors"] = std::move(tensors);
  manifest["ranks"] = std::move(ranks);
  // The shards must tile every tensor: a layout bug is caught here, by the check a reader makes, not at load.
  try {
    validate_manifest(manifest, (fs::path(tmp) / "manifest.json").string());
  } catch (const std::runtime_error& e) {
    throw std::logic_error(fmt::format("the ranks' pieces do not make a valid checkpoint: {}", e.what()));
  }
  // The manifest is the last file; then the whole directory appears at once.
  write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
  for (int r = 0; r < world; ++r) fs::remove(fs::path(tmp) / part_file(r));
  fsync_dir(tmp);
  crash_point("ckpt.manifest_written");
  const fs::path final_dir = fs::path(o_.dir) / step_dir_name(p.step);
  fs::path old;
  if (fs::exists(final_dir)) {  // saving a step again (after a resume): replace it only once ours is whole
    old = fs::path(o_.dir) / fmt::format(".old-{}", step_dir_name(p.step));
    remove_quietly(old);
    fs::rename(final_dir, old);
    crash_point("ckpt.old_renamed");
  }
  fs::rename(tmp, final_dir);
  fsync_dir(o_.dir);
  if (!old.empty()) remove_quietly(old);
  // Keep the newest `keep` complete checkpoints.
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(o_.dir)) {
    int64_t s = 0;
    if (parse_step_dir(e.path().filename().string(), s) && fs::exists(e.path() / "manifest.json")) {
      complete.emplace_back(s, e.path());
    }
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + o_.keep < complete.size(); ++i) retire(complete[i].second);
}

}  // namespace meshtrain::ckpt
