#include "meshtrain/runtime/runtime.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/backend.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/runtime/threads.h"

namespace meshtrain {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (!env.store_file.empty()) {  // one host: a file the ranks share, no socket to listen on
    auto store = c10::make_intrusive<c10d::FileStore>(env.store_file, env.world_size);
    store->setTimeout(timeout);
    return store;
  }
  // Across hosts: libtorch 1.13's TCPStore listens on every interface (it takes no bind address).
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = env.rank == 0;
  o.numWorkers = env.world_size;
  o.waitWorkers = true;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    if (env.rank == 0) {
      throw std::runtime_error(fmt::format(
          "rendezvous: rank 0 could not serve the store on {}:{} ({}). Is the port in use? "
          "Pass --master-port 0 to pick a free one, or choose another port.",
          env.master_addr, env.master_port, e.what()));
    }
    throw std::runtime_error(fmt::format(
        "rendezvous: rank {} could not reach rank 0's store at {}:{} within {} s ({}). Check MASTER_ADDR / "
        "MASTER_PORT and that rank 0 started.",
        env.rank, env.master_addr, env.master_port, timeout.count() / 1000, e.what()));
  }
}

}  // namespace

Runtime::Runtime(DistEnv env, RuntimeOptions opts) : env_(std::move(env)), opts_(opts) {}

Runtime::~Runtime() = default;

std::unique_ptr<Runtime> Runtime::init(const DistEnv& env, const RuntimeOptions& opts) {
  if (opts.configure_threads) configure_threads(env.local_world_size);
  std::unique_ptr<Runtime> rt(new Runtime(env, opts));
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  if (env.world_size == 1) {
    rt->world_ = std::make_unique<Comm>("world", 0, opts.backend);
    return rt;
  }
  if (!backend_available(opts.backend)) {
    throw std::invalid_argument(fmt::format("this build has no {} backend",
                                            opts.backend == BackendKind::Gloo ? "gloo" : "nccl"));
  }
  FlightRecorder::install_signal_handler();  // SIGUSR1: dump the last calls (flight_recorder.h)
  rt->store_ = connect_store(env, opts.timeout);
  rt->world_ = rt->new_group(all, "world");
  return rt;
}

std::unique_ptr<Comm> Runtime::new_group(const std::vector<int>& ranks, const std::string& name,
                                         std::optional<std::chrono::milliseconds> timeout) {
  auto it = std::find(ranks.begin(), ranks.end(), env_.rank);
  if (it == ranks.end()) {
    throw std::invalid_argument(fmt::format("new_group '{}': rank {} is not among [{}]", name, env_.rank,
                                            fmt::join(ranks, ", ")));
  }
  const int index = static_cast<int>(it - ranks.begin());
  if (ranks.size() == 1) return std::make_unique<Comm>(name, ranks[0], opts_.backend);
  // Members agree on the prefix: it is built from the name, the ranks and how
  // many groups over the same name and ranks they made before (a fresh prefix
  // per incarnation, or Gloo would read the previous group's addresses).
  std::string base = fmt::format("meshtrain/{}/{}", name, fmt::join(ranks, ","));
  const int incarnation = incarnations_[base]++;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(fmt::format("{}/{}", base, incarnation), store_);
  BackendOptions bo;
  bo.kind = opts_.backend;
  bo.timeout = timeout.value_or(opts_.timeout);
  bo.host = is_loopback(env_.master_addr) ? "127.0.0.1" : "";
  auto pg = make_backend(prefixed, index, static_cast<int>(ranks.size()), bo);
  auto comm = std::make_unique<Comm>(std::move(pg), opts_.backend, name, ranks, index);
  comm->set_timeout(bo.timeout);
  comm->set_check_every(opts_.check_every);
  return comm;
}

}  // namespace meshtrain
