#include "meshtrain/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <fstream>

#include "comm/shm_group.h"
#include "meshtrain/comm/hang_report.h"
#include "runtime/flight_collect.h"
#include "meshtrain/runtime/job_token.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signal = 0;  // last SIGINT/SIGTERM the launcher received

void on_signal(int sig) { g_signal = sig; }

// One output stream of a child: bytes not yet ending in a newline wait in `pending`.
struct Stream {
  int fd = -1;
  int target = 1;  // our fd to write to
  std::string pending;
  std::string error;  // the last "meshtrain: error: ..." line seen (the rank's own cause)
  bool quiet = false;  // after another rank failed: hold back error lines (their consequences)
  int held = 0;        // error lines held back
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  Stream out, err;
  bool exited = false;
  int status = 0;  // from waitpid
  bool terminated_by_us = false;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Emits every complete line of `s` (all of it when `flush`) with the rank prefix.
void emit_lines(Stream& s, int rank, bool flush) {
  size_t start = 0, nl;
  std::string out;
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    const bool error = s.pending.compare(start, 17, "meshtrain: error:") == 0;
    if (error) s.error = s.pending.substr(start + 17, nl - start - 17);
    if (s.quiet && (error || s.pending.compare(start, 7, "frame #") == 0)) {
      ++s.held;  // a connection reset and its backtrace, because another rank died first
    } else {
      out += fmt::format("[rank {}] ", rank);
      out.append(s.pending, start, nl - start + 1);
    }
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (flush && !s.pending.empty()) {
    out += fmt::format("[rank {}] {}\n", rank, s.pending);
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.target, out);
}

// Reads what is available; returns false at EOF (and closes the fd).
bool drain(Stream& s, int rank) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    emit_lines(s, rank, true);
    ::close(s.fd);
    s.fd = -1;
    return false;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  emit_lines(s, rank, false);
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  }
  return "unknown status";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// `host` (a dotted quad or a name) and `port` as an IPv4 socket address: what
// the port probes bind, so they ask about the address the job will use.
sockaddr_in ipv4_address(const std::string& host, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    throw std::invalid_argument(fmt::format("--master-addr {} is neither an IPv4 address nor a host name this machine "
                                            "resolves",
                                            host));
  }
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return sa;
}

void start_child(Child& c, const LaunchOptions& o, int local_rank, int restart, const std::string& flight_dir,
                 const std::string& store_file) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(fmt::format("launch: pipe() failed: {}", strerror(errno)));
  }
  const pid_t parent = getpid();
  const int world = o.nnodes * o.nproc_per_node;
  c.rank = o.node_rank * o.nproc_per_node + local_rank;
  std::vector<std::pair<std::string, std::string>> env{
      {"RANK", std::to_string(c.rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"MESHTRAIN_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"MESHTRAIN_JOB", std::to_string(parent)},  // names the ranks' shared-memory segments (comm/shm_group.h)
      {"MESHTRAIN_FLIGHT_DIR", flight_dir},       // where ranks dump their last calls (comm/flight_recorder.h)
  };
  if (!store_file.empty()) env.emplace_back("MESHTRAIN_STORE_FILE", store_file);  // runtime/env.h
  for (auto& kv : missing_rank_environment(o.nproc_per_node)) env.push_back(kv);
  env.emplace_back("MESHTRAIN_NO_REEXEC", "1");  // the launcher already set them

  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("launch: fork() failed: {}", strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[0]);
    close(err_pipe[1]);
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::string msg = fmt::format("meshtrain launch: cannot run '{}': {}\n", o.command[0], strerror(errno));
    write_all(2, msg);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so signals sent right away reach it
  close(out_pipe[1]);
  close(err_pipe[1]);
  c.pid = pid;
  c.out = Stream{out_pipe[0], 1, {}, {}, false, 0};
  c.err = Stream{err_pipe[0], 2, {}, {}, false, 0};
  c.exited = false;
  c.terminated_by_us = false;
}

void signal_alive(std::vector<Child>& children, int sig, bool by_us) {
  for (auto& c : children) {
    if (c.exited) continue;
    kill(-c.pid, sig);  // the child's whole process group
    if (by_us) c.terminated_by_us = true;
  }
}

struct Outcome {
  int failed_rank = -1;  // -1: none
  int status = 0;
  int user_signal = 0;
  std::string error;  // the failed rank's own error line, if it printed one
  int held = 0;       // the other ranks' error lines after the failure, not printed
  std::map<int, std::string> states;  // the live ranks' processes when it failed
};

// The kernel's count of processes its out-of-memory killer has stopped
// (/proc/vmstat oom_kill, Linux >= 4.13; -1 when unknown).
int64_t oom_kills() {
  std::ifstream f("/proc/vmstat");
  std::string key;
  int64_t v = 0;
  while (f >> key >> v) {
    if (key == "oom_kill") return v;
  }
  return -1;
}

// Watches the children until all have exited and their output is drained.
Outcome supervise(std::vector<Child>& children, double grace_seconds, const std::string& flight_dir) {
  Outcome res;
  bool stopping = false;
  Clock::time_point kill_at{}, all_exited_at{};
  bool killed = false;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    for (auto& c : children) {
      for (Stream* s : {&c.out, &c.err}) {
        if (s->fd >= 0) {
          fds.push_back(pollfd{s->fd, POLLIN, 0});
          owners.emplace_back(&c, s);
        }
      }
    }
    int ready = fds.empty() ? 0 : poll(fds.data(), fds.size(), 50);
    if (fds.empty()) usleep(20000);
    if (ready > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*owners[i].second, owners[i].first->rank);
      }
    }
    bool all_exited = true;
    for (auto& c : children) {
      if (!c.exited) {
        int st = 0;
        pid_t r = waitpid(c.pid, &st, WNOHANG);
        if (r == c.pid) {
          c.exited = true;
          c.status = st;
          if (failed(st) && !c.terminated_by_us && res.failed_rank < 0 && !stopping) {
            res.failed_rank = c.rank;
            res.status = st;
          }
        }
      }
      all_exited = all_exited && c.exited;
    }
    const auto now = Clock::now();
    if (g_signal != 0 && res.user_signal == 0) {
      res.user_signal = g_signal;
      signal_alive(children, g_signal, true);
      stopping = true;
      kill_at = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds));
    }
    if (res.failed_rank >= 0 && !stopping) {
      // From here on the other ranks' errors are consequences (connection resets): count them, print the cause.
      if (!std::getenv("MESHTRAIN_LAUNCH_ALL_ERRORS")) {
        for (auto& c : children) c.err.quiet = c.out.quiet = c.rank != res.failed_rank;
      }
      // Before stopping them: the live ranks' flight records, and what their processes are doing.
      std::vector<std::pair<int, pid_t>> alive;
      for (const auto& c : children) {
        if (!c.exited) alive.emplace_back(c.rank, c.pid);
      }
      res.states = collect_flight_records(alive, flight_dir, 2.0);
      signal_alive(children, SIGTERM, true);
      stopping = true;
      kill_at = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds));
    }
    if (stopping && !killed && !all_exited && now >= kill_at) {
      signal_alive(children, SIGKILL, true);
      killed = true;
    }
    if (all_exited) {
      // Grandchildren may still hold a pipe open: give output one second, then stop.
      if (all_exited_at == Clock::time_point{}) all_exited_at = now;
      bool open = fds.size() > 0;
      if (!open || now - all_exited_at > std::chrono::seconds(1)) {
        for (auto& c : children) {
          for (Stream* s : {&c.out, &c.err}) {
            if (s->fd >= 0) {
              emit_lines(*s, c.rank, true);
              close(s->fd);
              s->fd = -1;
            }
          }
          kill(-c.pid, SIGKILL);  // leftover grandchildren
        }
        for (const auto& c : children) {
          if (c.rank == res.failed_rank) res.error = c.err.error.empty() ? c.out.error : c.err.error;
          res.held += c.err.held + c.out.held;
        }
        return res;
      }
    }
  }
}

}  // namespace

int pick_free_port(const std::string& addr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("socket() failed: {}", strerror(errno)));
  sockaddr_in sa = ipv4_address(addr, 0);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    throw std::runtime_error(fmt::format("could not bind a free port on {}: {}", addr, strerror(errno)));
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

void validate(LaunchOptions& o) {
  if (o.command.empty()) {
    throw std::invalid_argument("launch: no command given; usage: meshtrain launch [options] PROGRAM [ARGS...]");
  }
  if (o.nproc_per_node < 1) {
    throw std::invalid_argument(fmt::format("--nproc-per-node {} must be at least 1", o.nproc_per_node));
  }
  if (o.nnodes < 1) throw std::invalid_argument(fmt::format("--nnodes {} must be at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw std::invalid_argument(fmt::format("--node-rank {} must be in 0..{} (--nnodes {})", o.node_rank,
                                            o.nnodes - 1, o.nnodes));
  }
  check_job_token(o.nnodes > 1 && !loopback_host(o.master_addr));
  if (o.max_restarts < 0) throw std::invalid_argument(fmt::format("--max-restarts {} must be >= 0", o.max_restarts));
  if (o.master_port < 0 || o.master_port > 65535) {
    throw std::invalid_argument(fmt::format("--master-port {} is not a TCP port (0..65535)", o.master_port));
  }
  if (o.master_port == 0) {
    if (o.nnodes > 1) {
      throw std::invalid_argument(
          "--master-port 0 (pick a free port) works on one node only; give every node the same explicit port");
    }
    o.master_port = pick_free_port(o.master_addr);
    return;
  }
  if (o.node_rank != 0) return;
  // The master node's rank 0 will serve the store on this port: is it free?
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // ignore TIME_WAIT leftovers
  sockaddr_in sa = ipv4_address(o.master_addr, o.master_port);
  const bool in_use = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno == EADDRINUSE;
  close(fd);
  if (in_use) {
    throw std::invalid_argument(fmt::format(
        "--master-port {} is in use on this machine; pass --master-port 0 to pick a free port, or another port",
        o.master_port));
  }
}

int launch(LaunchOptions o) {
  validate(o);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  g_signal = 0;
  bool owned = false;
  const std::string flight_dir = flight_directory(&owned);
  struct Cleanup {  // the flight records go with the job, unless a report points at them
    std::string dir;
    bool remove;
    ~Cleanup() {
      std::error_code ec;
      if (remove) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{flight_dir, owned};

  for (int attempt = 0;; ++attempt) {
    std::vector<Child> children(o.nproc_per_node);
    const int64_t oom_before = oom_kills();
    clear_flight_records(flight_dir);
    // One host: the ranks meet through a file in the job's directory (no TCP listener); several: the TCP store.
    const std::string store_file = o.nnodes == 1 ? fmt::format("{}/store-{}", flight_dir, attempt) : "";
    for (int i = 0; i < o.nproc_per_node; ++i) start_child(children[i], o, i, attempt, flight_dir, store_file);
    Outcome res = supervise(children, o.grace_seconds, flight_dir);
    if (!store_file.empty()) std::remove(store_file.c_str());
    // Segments a rank killed during start-up left behind (the others unlink theirs once mapped).
    if (const int left = remove_job_segments(std::to_string(getpid())); left > 0 && res.failed_rank < 0) {
      fmt::print(stderr, "meshtrain launch: removed {} shared-memory segment(s) the ranks left in {}\n", left,
                 shm_directory());
    }
    if (res.user_signal != 0) {
      fmt::print(stderr, "meshtrain launch: got signal {} ({}), stopped all {} ranks\n", res.user_signal,
                 strsignal(res.user_signal), o.nproc_per_node);
      return 128 + res.user_signal;
    }
    if (res.failed_rank < 0) return 0;
    std::string what = fmt::format("rank {} failed with {}", res.failed_rank, describe_status(res.status));
    if (!res.error.empty()) what += fmt::format(" (its error:{})", res.error);
    if (res.held > 0) {
      what += fmt::format("; {} error line(s) the other ranks printed after it are left out (consequences of its "
                          "failure; MESHTRAIN_LAUNCH_ALL_ERRORS=1 prints them)",
                          res.held);
    }
    const int64_t oom_after = oom_kills();
    if (WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGKILL && oom_before >= 0 && oom_after > oom_before) {
      // Nobody here sent that SIGKILL (a rank killed by the launcher is not the failed one).
      what += fmt::format(": the kernel's out-of-memory killer stopped {} process(es) meanwhile (/proc/vmstat "
                          "oom_kill {} -> {}), so this rank most likely ran out of memory (a smaller micro_batch, "
                          "ZeRO, recomputation or tiled attention lower it; `meshtrain plan` estimates it)",
                          oom_after - oom_before, oom_before, oom_after);
    }
    // Who the others waited for, from the ranks' flight records (comm/hang_report.h).
    if (const auto records = read_flight_records(flight_dir); !records.empty()) {
      const HangReport rep =
          hang_report(records, o.nnodes * o.nproc_per_node, res.states, o.nnodes > 1 ? o.nproc_per_node : 0);
      fmt::print(stderr, "meshtrain launch: the ranks' last calls (flight records in {}; `meshtrain diagnose hang "
                         "{}` prints this again):\n{}", flight_dir, flight_dir, rep.text);
      const bool failed_is_behind =
          std::find(rep.behind.begin(), rep.behind.end(), res.failed_rank) != rep.behind.end();
      if (!rep.blame.empty() && !failed_is_behind) what = rep.blame + "; " + what;  // the cause first
      cleanup.remove = false;
    }
    if (attempt < o.max_restarts) {
      fmt::print(stderr, "meshtrain launch: {}; restarting all local ranks ({} of {} restarts)\n", what,
                 attempt + 1, o.max_restarts);
      continue;
    }
    fmt::print(stderr, "meshtrain launch: {}; stopped the other ranks{}\n", what,
               o.max_restarts ? fmt::format(" (after {} restarts)", o.max_restarts) : "");
    return exit_code_of(res.status);
  }
}

}  // namespace meshtrain
