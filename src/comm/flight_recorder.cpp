#include "meshtrain/comm/flight_recorder.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace meshtrain {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t capacity_from_env() {
  const char* v = std::getenv("MESHTRAIN_FLIGHT_RECORDER");
  if (v == nullptr || *v == '\0') return 2000;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0) {
    throw std::invalid_argument(fmt::format(
        "MESHTRAIN_FLIGHT_RECORDER='{}' is not a count of calls; give how many calls each rank keeps (0: none), or "
        "unset it (2000)", v));
  }
  return static_cast<size_t>(n);
}

int g_pipe[2] = {-1, -1};

void on_sigusr1(int) {
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &b, 1);  // async-signal-safe
}

}  // namespace

const char* to_string(CallState s) {
  switch (s) {
    case CallState::Started: return "started";
    case CallState::Completed: return "completed";
    case CallState::Failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) { ring_.reserve(capacity); }

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder* r = new FlightRecorder(capacity_from_env());  // never destroyed: dumps may come late
  return *r;
}

int FlightRecorder::group(const std::string& name, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i].name == name && groups_[i].ranks == ranks) return static_cast<int>(i);
  }
  groups_.push_back({name, ranks});
  return static_cast<int>(groups_.size() - 1);
}

uint64_t FlightRecorder::start(int group, const CallDesc& call) {
  if (capacity_ == 0) return 0;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  FlightEntry e{id, group, call, t, 0, CallState::Started};
  if (ring_.size() < capacity_) ring_.push_back(e);
  else ring_[(id - 1) % capacity_] = e;
  return id;
}

void FlightRecorder::end(uint64_t id, CallState state) {
  if (id == 0) return;
  const double t = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[(id - 1) % capacity_];
  if (e.id != id) return;  // overwritten already
  e.end = t;
  e.state = state;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  out.reserve(ring_.size());
  const size_t n = ring_.size();
  const size_t first = n < capacity_ ? 0 : (next_id_ - 1) % capacity_;  // the oldest slot once full
  for (size_t i = 0; i < n; ++i) out.push_back(ring_[(first + i) % n]);
  return out;
}

std::vector<FlightGroup> FlightRecorder::groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_;
}

std::string FlightRecorder::to_json(const std::string& reason) const {
  const char* rank = std::getenv("RANK");
  nlohmann::json j{{"rank", rank ? std::atoi(rank) : 0}, {"pid", ::getpid()}, {"reason", reason}, {"time", now_s()}};
  j["groups"] = nlohmann::json::array();
  for (const auto& g : groups()) j["groups"].push_back({{"name", g.name}, {"ranks", g.ranks}});
  j["calls"] = nlohmann::json::array();
  for (const auto& e : entries()) {
    j["calls"].push_back({{"id", e.id}, {"group", e.group}, {"seq", e.call.seq},
                          {"op", to_string(e.call.kind)}, {"dtype", e.call.dtype}, {"numel", e.call.numel},
                          {"root", e.call.root}, {"reduce", e.call.reduce}, {"start", e.start}, {"end", e.end},
                          {"state", to_string(e.state)}, {"what", describe_call(e.call)}});
  }
  return j.dump(1);
}

void FlightRecorder::dump(const std::string& reason) const {
  const char* dir = std::getenv("MESHTRAIN_FLIGHT_DIR");
  if (dir == nullptr || *dir == '\0' || capacity_ == 0) return;
  const char* rank = std::getenv("RANK");
  const std::string path = fmt::format("{}/rank_{:05d}.json", dir, rank ? std::atoi(rank) : 0);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  {
    std::ofstream f(tmp);
    f << to_json(reason);
    if (!f) return;  // best effort: a full disk must not hide the error that made us dump
  }
  std::rename(tmp.c_str(), path.c_str());
}

void FlightRecorder::install_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe(g_pipe) != 0) return;
    std::thread([] {
      char b = 0;
      while (::read(g_pipe[0], &b, 1) == 1) FlightRecorder::instance().dump("SIGUSR1 (the launcher asked)");
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
  });
}

}  // namespace meshtrain
