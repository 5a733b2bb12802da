#include "meshtrain/platform/threads.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>

#include "meshtrain/platform/vector_math_warmup.h"

namespace meshtrain {
namespace {

// Keep freed tensor buffers in the heap instead of returning them to the kernel
// every step (PLATFORM.md: 1.5-4x faster CPU training).
constexpr const char* kMallocTunables = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736";

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// Set by the user, not by meshtrain's own re-exec for one process (which lists
// what it set in MESHTRAIN_AUTO_ENV): a command that re-executed itself with
// the thread counts of one process and then launches N ranks must give them
// the counts of N ranks, not all the cores each.
bool user_set(const char* name) {
  if (!env_set(name)) return false;
  const char* ours = std::getenv("MESHTRAIN_AUTO_ENV");
  if (ours == nullptr) return true;
  const std::string list = std::string(",") + ours + ",";
  return list.find(std::string(",") + name + ",") == std::string::npos;
}

}  // namespace

int threads_per_rank(int local_world_size) {
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && *v && user_set("OMP_NUM_THREADS")) {
    int n = std::atoi(v);
    if (n > 0) return n;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return std::max(1L, cores / std::max(1, local_world_size));
}

void configure_threads(int local_world_size) {
  const int n = threads_per_rank(local_world_size);
  at::set_num_threads(n);
  static bool interop_set = false;  // may be set only once per process
  if (!interop_set) {
    interop_set = true;
    try {
      at::set_num_interop_threads(1);
    } catch (const std::exception&) {
      // already started by an earlier parallel region: keep it
    }
  }
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
  warm_up_vector_math();
}

std::vector<std::pair<std::string, std::string>> missing_rank_environment(int local_world_size) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string n = std::to_string(threads_per_rank(local_world_size));
  if (!env_set("OMP_WAIT_POLICY")) out.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
  if (!user_set("OMP_NUM_THREADS")) out.emplace_back("OMP_NUM_THREADS", n);
  if (!user_set("OPENBLAS_NUM_THREADS")) out.emplace_back("OPENBLAS_NUM_THREADS", n);
  if (!env_set("GLIBC_TUNABLES")) out.emplace_back("GLIBC_TUNABLES", kMallocTunables);
  return out;
}

void keep_freed_memory() {
  if (env_set("GLIBC_TUNABLES")) return;  // the user's (or a launcher's) settings, read by glibc at start-up
  // kMallocTunables for this process: every allocation from the heap, which is never trimmed.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);  // -1: never (mallopt(3))
}

void reexec_with_rank_environment(char** argv, int local_world_size) {
  keep_freed_memory();
  if (env_set("MESHTRAIN_NO_REEXEC")) return;
  // One process on the node owns its cores: libgomp's default wait policy costs nothing there, and
  // the thread counts are set at run time (configure_threads). It starts at once, without loading
  // libtorch a second time (0.5 s). Its own ranks, if it starts some, get the environment from it.
  if (local_world_size <= 1) return;
  auto missing = missing_rank_environment(local_world_size);
  if (missing.empty()) return;
  std::string auto_env;
  for (auto& [k, v] : missing) {
    if (!env_set(k.c_str())) auto_env += (auto_env.empty() ? "" : ",") + k;
    setenv(k.c_str(), v.c_str(), 1);
  }
  setenv("MESHTRAIN_AUTO_ENV", auto_env.c_str(), 1);
  setenv("MESHTRAIN_NO_REEXEC", "1", 1);  // once only, whatever happens
  execv("/proc/self/exe", argv);
}

}  // namespace meshtrain
