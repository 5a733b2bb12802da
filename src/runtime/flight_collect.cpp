#include "runtime/flight_collect.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// From /proc/PID/status: the state letter and whether SIGUSR1 is caught.
struct ProcState {
  char state = '?';
  bool catches_usr1 = false;
};

ProcState proc_state(pid_t pid) {
  ProcState p;
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("State:", 0) == 0 && line.size() > 7) p.state = line[line.find_first_not_of(" \t", 6)];
    if (line.rfind("SigCgt:", 0) == 0) {
      const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
      p.catches_usr1 = (mask >> (SIGUSR1 - 1)) & 1;
    }
  }
  return p;
}

std::string describe(char state) {
  switch (state) {
    case 'T': return "stopped (SIGSTOP or a debugger)";
    case 't': return "stopped by a debugger";
    case 'D': return "in an uninterruptible wait (disk or device I/O)";
    case 'Z': return "exited";
    case 'R': return "running";
    case 'S': return "sleeping";
    default: return fmt::format("in state '{}'", state);
  }
}

std::string record_path(const std::string& dir, int rank) { return fmt::format("{}/rank_{:05d}.json", dir, rank); }

}  // namespace

std::string flight_directory(bool* owned) {
  if (const char* v = std::getenv("MESHTRAIN_FLIGHT_DIR"); v && *v) {
    fs::create_directories(v);
    *owned = false;
    return v;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/meshtrain-flight-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error(fmt::format("launch: cannot make {}: {}", pattern, std::strerror(errno)));
  }
  *owned = true;
  return pattern;
}

void clear_flight_records(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("rank_", 0) == 0) fs::remove(e.path(), ec);
  }
}

std::map<int, std::string> collect_flight_records(const std::vector<std::pair<int, pid_t>>& alive,
                                                  const std::string& dir, double wait_s) {
  std::map<int, std::string> states;
  std::vector<std::pair<int, fs::file_time_type>> asked;  // rank, its record's time before asking
  for (const auto& [rank, pid] : alive) {
    const ProcState p = proc_state(pid);
    states[rank] = describe(p.state);
    if (!p.catches_usr1 || p.state == 'T' || p.state == 't') continue;  // it could not answer
    std::error_code ec;
    const auto before = fs::last_write_time(record_path(dir, rank), ec);
    asked.emplace_back(rank, ec ? fs::file_time_type::min() : before);
    ::kill(pid, SIGUSR1);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (bool all = asked.empty(); !all && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    all = true;
    for (const auto& [rank, before] : asked) {
      std::error_code ec;
      const auto t = fs::last_write_time(record_path(dir, rank), ec);
      all = all && !ec && t > before;
    }
  }
  return states;
}

}  // namespace meshtrain
