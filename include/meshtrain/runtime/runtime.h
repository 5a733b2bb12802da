// Runtime: rendezvous (c10d TCPStore, rank 0 serves it), the world group, and
// construction of sub-groups. One per process; created after the launcher set
// the environment (runtime/env.h).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/compat.h"
#include "meshtrain/runtime/env.h"

namespace meshtrain {

struct RuntimeOptions {
  BackendKind backend = BackendKind::Gloo;
  // Collective and rendezvous timeout. Short enough that a hang becomes a clear
  // error in minutes, long enough for first-step compilation and checkpoint I/O.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The Gloo agreement check's period (comm.h): every n-th collective of a group.
  int check_every = 64;
  bool configure_threads = true;  // apply per-rank thread counts (platform/threads.h)
};

class Runtime {
 public:
  // Joins the job described by `env` (single-process when env.world_size == 1).
  // Throws std::runtime_error naming the address and the fix when the
  // rendezvous port is in use or rank 0 cannot be reached.
  static std::unique_ptr<Runtime> init(const DistEnv& env, const RuntimeOptions& opts = {});
  ~Runtime();

  const DistEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const RuntimeOptions& options() const { return opts_; }
  Comm& world() { return *world_; }

  // A group over `ranks` (global ranks, in group order). Every member must call
  // this with the same ranks and name, in the same order relative to other
  // new_group calls; non-members must not call it. Its collectives time out
  // after `timeout` (default: the runtime's), e.g. a checkpoint's group waits
  // longer for a slow disk than training waits for a lost rank.
  std::unique_ptr<Comm> new_group(const std::vector<int>& ranks, const std::string& name,
                                  std::optional<std::chrono::milliseconds> timeout = std::nullopt);

 private:
  Runtime(DistEnv env, RuntimeOptions opts);
  DistEnv env_;
  RuntimeOptions opts_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Comm> world_;
  std::map<std::string, int> incarnations_;  // groups made per name and ranks
};

}  // namespace meshtrain
