#include "meshtrain/platform/crash_point.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace meshtrain {
namespace {

struct Armed {
  std::string name;  // "" = no crash point armed (or not on this rank)
  int nth = 1;
  int signal = SIGKILL;
};

Armed parse(const char* v) {
  Armed a;
  if (v == nullptr) return a;
  std::istringstream words(v);
  words >> a.name;
  const auto bad = [&](const std::string& what) {
    return std::invalid_argument("MESHTRAIN_CRASH_AT='" + std::string(v) + "': " + what +
                                 "; use \"POINT[@K] [rank=R] [signal=KILL|STOP|SLEEP]\" (K >= 1), or unset it");
  };
  if (const auto at = a.name.find('@'); at != std::string::npos) {
    const std::string k = a.name.substr(at + 1);
    if (k.empty() || k.find_first_not_of("0123456789") != std::string::npos || std::atoi(k.c_str()) < 1) {
      throw bad("'@" + k + "' is not a count >= 1");
    }
    a.nth = std::atoi(k.c_str());
    a.name.resize(at);
  }
  bool on_this_rank = true;
  for (std::string w; words >> w;) {
    if (w.rfind("rank=", 0) == 0) {
      const char* rank = std::getenv("RANK");
      on_this_rank = std::string(rank ? rank : "0") == w.substr(5);
    } else if (w == "signal=KILL") {
      a.signal = SIGKILL;
    } else if (w == "signal=STOP") {
      a.signal = SIGSTOP;
    } else if (w == "signal=SLEEP") {
      a.signal = 0;  // this thread sleeps for ever; the process still answers signals
    } else {
      throw bad("unknown word '" + w + "'");
    }
  }
  if (!on_this_rank) a.name.clear();
  return a;
}

}  // namespace

void crash_point(const char* name) {
  static const Armed armed = parse(std::getenv("MESHTRAIN_CRASH_AT"));
  static std::atomic<int> reached{0};
  if (armed.name.empty() || armed.name != name || ++reached != armed.nth) return;
  std::fprintf(stderr, "meshtrain: crash point %s reached (MESHTRAIN_CRASH_AT): %s\n", name,
               armed.signal == SIGSTOP ? "stopping this process"
               : armed.signal == 0     ? "this thread sleeps for ever"
                                       : "killing this process");
  std::fflush(stderr);
  if (armed.signal == 0) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  ::raise(armed.signal);
}

}  // namespace meshtrain
