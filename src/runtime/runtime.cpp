#include "meshtrain/runtime/runtime.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/backend.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/runtime/job_token.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain {
namespace {

// A socket bound to `host`:`port` and listening, for rank 0's store. TCPStore alone listens on
// every interface; bound here, the store answers only on the address the job names (a job on
// 127.0.0.1 is invisible to other hosts). TCPStore takes the descriptor over.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error(fmt::format("rendezvous: MASTER_ADDR {} does not resolve ({})", host, gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 2048) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error(fmt::format("rendezvous: rank 0 cannot listen on {}:{} ({}). Is the port in use, or is {} "
                                       "not an address of this host? Pass --master-port 0 to pick a free port.",
                                       host, port, why, host));
}

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  if (!env.store_file.empty()) {  // one host: a file the ranks share, no socket to listen on
    auto store = c10::make_intrusive<c10d::FileStore>(env.store_file, env.world_size);
    store->setTimeout(timeout);
    return store;
  }
  // Across hosts a job token is required (job_token.h); given, it is checked on any TCP store. Checked
  // before rank 0 opens a socket: a refused start listens on nothing.
  const std::optional<std::string> token = job_token();
  check_job_token(env.world_size > env.local_world_size && !loopback_host(env.master_addr));
  // Across hosts: rank 0 serves the store on the master address only (listen_on).
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = env.rank == 0;
  if (o.isServer) o.masterListenFd = listen_on(env.master_addr, env.master_port);
  o.numWorkers = env.world_size;
  o.waitWorkers = true;
  o.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
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
  authenticate_rendezvous(*store, env.rank, env.world_size, token);
  return store;
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
    throw std::invalid_argument(opts.backend == BackendKind::Gloo
                                    ? std::string("this build has no gloo backend")
                                    : fmt::format("the nccl backend needs CUDA: {}", cuda_absence_reason()));
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
  bo.host = loopback_host(env_.master_addr) ? "127.0.0.1" : "";
  auto pg = make_backend(prefixed, index, static_cast<int>(ranks.size()), bo);
  auto comm = std::make_unique<Comm>(std::move(pg), opts_.backend, name, ranks, index);
  comm->set_timeout(bo.timeout);
  comm->set_check_every(opts_.check_every);
  return comm;
}

}  // namespace meshtrain
