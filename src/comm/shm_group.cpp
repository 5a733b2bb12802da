#include "comm/shm_group.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <filesystem>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "comm/backend.h"
#include "meshtrain/comm/transport_env.h"

#ifdef __linux__
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace meshtrain {

struct ShmGroup::Header {
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the barrier needs address-free atomics");

namespace {

constexpr size_t kHeaderBytes = 4096;
constexpr size_t kCallSlotOffset = 1024;  // two CallDesc slots in every segment's header

// What identifies this host (and its /dev/shm) to the other ranks: the host name
// and the kernel's boot id. Ranks in separate mount namespaces share both; the
// segment opening below catches them.
int64_t host_id() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return static_cast<int64_t>(std::hash<std::string>{}(std::string(name) + "/" + boot) >> 1);
}

// MESHTRAIN_SHM (transport_env.h): the launcher gives every rank the same environment, so a
// bad value makes every rank throw before the collective set-up.
bool shm_wanted() { return transport_switch("MESHTRAIN_SHM"); }

// Element-wise MAX over the group, through the raw process group.
at::Tensor all_max(PGBackend& pg, std::vector<int64_t> values) {
  at::Tensor t = at::tensor(values, at::kLong);
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  pg.allreduce(v, o)->wait();
  return t;
}

// Where the segments live: a tmpfs, /dev/shm unless MESHTRAIN_SHM_DIR names
// another (containers often give /dev/shm only 64 MiB).
std::string shm_dir() { return shm_directory(); }

std::string job_prefix(const std::string& job) { return fmt::format("meshtrain-j{}-", job); }

std::string segment_path(int64_t pid0, int64_t serial0, int rank) {
  const char* job = std::getenv("MESHTRAIN_JOB");
  return fmt::format("{}/{}{}-{}-{}", shm_dir(), job_prefix(job && *job ? job : "0"), pid0, serial0, rank);
}

}  // namespace

std::string shm_directory() {
  const char* v = std::getenv("MESHTRAIN_SHM_DIR");
  return v && *v ? v : "/dev/shm";
}

int remove_job_segments(const std::string& job) {
  int removed = 0;
  std::error_code ec;
  const std::string prefix = job_prefix(job);
  for (const auto& e : std::filesystem::directory_iterator(shm_directory(), ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0 && std::filesystem::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

ShmGroup::ShmGroup(int index, int size, int64_t capacity, std::chrono::milliseconds timeout)
    : index_(index), size_(size), capacity_(capacity), timeout_(timeout), maps_(size, nullptr) {}

ShmGroup::~ShmGroup() {
#ifdef __linux__
  for (uint8_t* p : maps_) {
    if (p) munmap(p, map_bytes_);
  }
#endif
}

uint8_t* ShmGroup::buffer(int r) const { return maps_[r] + kHeaderBytes + (op_ % 2) * capacity_; }

CallDesc* ShmGroup::slot(int r) const {
  static_assert(kCallSlotOffset >= sizeof(Header) && kCallSlotOffset + 2 * sizeof(CallDesc) <= kHeaderBytes);
  return reinterpret_cast<CallDesc*>(maps_[r] + kCallSlotOffset) + op_ % 2;
}

void ShmGroup::next(const CallDesc& d) {
  ++op_;
  *slot(index_) = d;  // published by the barrier's release
}

int ShmGroup::disagreeing(CallDesc* theirs) const {
  const CallDesc& mine = *slot(index_);
  for (int r = 0; r < size_; ++r) {
    if (r == index_) continue;
    const CallDesc peer = *slot(r);
    if (peer != mine) {
      *theirs = peer;
      return r;
    }
  }
  return -1;
}

#ifdef __linux__

std::unique_ptr<ShmGroup> ShmGroup::create(PGBackend& pg, int index, int size, int64_t capacity,
                                           std::chrono::milliseconds timeout, std::string* why) {
  static std::atomic<int64_t> serial{0};
  const int64_t host = host_id();
  const bool wanted = shm_wanted();
  const int64_t my_serial = serial++;
  // [host, -host] agree iff every rank has the same host; rank 0 names the
  // segments; the largest capacity asked for is every rank's (ranks that
  // disagree on a call may ask for different ones); slot 6 + r holds rank r's pid.
  std::vector<int64_t> mine_in{host, -host, wanted ? 0 : 1, index == 0 ? getpid() : 0,
                               index == 0 ? my_serial : 0, capacity};
  mine_in.resize(6 + size, 0);
  mine_in[6 + index] = getpid();
  at::Tensor agreed = all_max(pg, mine_in);
  auto a = agreed.accessor<int64_t, 1>();
  if (a[0] != -a[1]) {
    *why = "the ranks of this group are not all on one host";
    return nullptr;
  }
  if (a[2]) {
    *why = "MESHTRAIN_SHM=0";
    return nullptr;
  }
  capacity = a[5];
  std::unique_ptr<ShmGroup> g(new ShmGroup(index, size, capacity, timeout));
  for (int r = 0; r < size; ++r) g->pids_.push_back(a[6 + r]);
  g->map_bytes_ = kHeaderBytes + 2 * static_cast<size_t>(capacity);
  const std::string mine = segment_path(a[3], a[4], index);

  // Each rank creates and sizes its own segment. posix_fallocate reserves the
  // pages now: a full /dev/shm is an error here, not a SIGBUS at first write.
  std::string error;
  int fd = open(mine.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {  // left by a dead process that had rank 0's pid
    unlink(mine.c_str());
    fd = open(mine.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) {
    error = fmt::format("cannot create {}: {}", mine, std::strerror(errno));
  } else {
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(g->map_bytes_));
    if (rc != 0) {
      error = fmt::format("cannot reserve {} MiB in {}: {} (MESHTRAIN_SHM_DIR may name a larger tmpfs)",
                          g->map_bytes_ >> 20, shm_dir(), std::strerror(rc));
    } else {
      void* p = mmap(nullptr, g->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) error = fmt::format("cannot map {}: {}", mine, std::strerror(errno));
      else g->maps_[index] = static_cast<uint8_t*>(p);
    }
    close(fd);
  }
  // Whether this rank sees every other rank's process (not so across pid
  // namespaces): only then does the barrier watch for ranks that are gone.
  bool sees_all = true;
  for (int r = 0; r < size; ++r) sees_all = sees_all && kill(static_cast<pid_t>(a[6 + r]), 0) == 0;
  auto fail_if_any = [&](const char* stage, bool* blind = nullptr) {
    at::Tensor bad = all_max(pg, {error.empty() ? 0 : 1, sees_all ? 0 : 1});
    if (blind) *blind = bad[1].item<int64_t>() != 0;
    if (bad[0].item<int64_t>() == 0) return false;
    *why = error.empty() ? fmt::format("another rank could not {}", stage) : error;
    return true;
  };
  bool blind = false;
  if (fail_if_any("create its segment", &blind)) {
    unlink(mine.c_str());
    return nullptr;
  }
  if (blind) g->pids_.clear();
  for (int r = 0; r < size && error.empty(); ++r) {
    if (r == index) continue;
    const std::string path = segment_path(a[3], a[4], r);
    fd = open(path.c_str(), O_RDWR);
    if (fd < 0) {
      error = fmt::format("cannot open {} of group rank {}: {} (ranks with separate {}s, or different "
                          "MESHTRAIN_SHM_DIR?)", path, r, std::strerror(errno), shm_dir());
      break;
    }
    void* p = mmap(nullptr, g->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) error = fmt::format("cannot map {}: {}", path, std::strerror(errno));
    else g->maps_[r] = static_cast<uint8_t*>(p);
  }
  // Every rank has mapped every segment (or failed): the names can go. A crash
  // before this line leaves files in the shm directory named after rank 0's pid.
  const bool failed = fail_if_any("map the segments");
  unlink(mine.c_str());
  if (failed) return nullptr;
  g->header_ = reinterpret_cast<Header*>(g->maps_[0]);
  return g;
}

void ShmGroup::barrier() {
  Header* h = header_;
  const uint32_t gen = h->generation.load(std::memory_order_acquire);
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    // Last to arrive: reset the count before publishing the new generation, so
    // a rank that sees the new generation and moves on counts from zero.
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.store(gen + 1, std::memory_order_release);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->generation), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    return;
  }
  // A short spin serves ranks that own a core; then sleep in the kernel, which
  // is what ranks that share cores need (a spinning rank steals the core the
  // last arrival needs).
  for (int i = 0; i < 2000; ++i) {
    if (h->generation.load(std::memory_order_acquire) != gen) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (h->generation.load(std::memory_order_acquire) == gen) {
    timespec slice{0, 50'000'000};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h->generation), FUTEX_WAIT, gen, &slice, nullptr, 0);
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (kill(static_cast<pid_t>(pids_[r]), 0) != 0 && errno == ESRCH) {
        throw std::runtime_error(fmt::format(
            "group rank {} (pid {}) exited while the others waited for it at the shared-memory barrier", r, pids_[r]));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(fmt::format(
          "timed out after {} s at the shared-memory barrier: {} of {} ranks arrived; a rank that never arrives "
          "usually made a different call (compare the sequence numbers the ranks report)",
          timeout_.count() / 1000.0,
          h->arrived.load(), size_));
    }
  }
}

#else  // shared memory groups are Linux-only

std::unique_ptr<ShmGroup> ShmGroup::create(PGBackend&, int, int, int64_t, std::chrono::milliseconds,
                                           std::string* why) {
  *why = "shared-memory groups need Linux";
  return nullptr;
}

void ShmGroup::barrier() {}

#endif

}  // namespace meshtrain
