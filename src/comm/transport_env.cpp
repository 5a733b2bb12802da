#include "meshtrain/comm/transport_env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace meshtrain {

std::string transport_variables() {
  std::vector<std::string> set;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    for (const char* prefix : {"NCCL_", "GLOO_", "MESHTRAIN_SHM", "MESHTRAIN_FLIGHT_RECORDER="}) {
      if (kv.rfind(prefix, 0) == 0) {
        set.push_back(kv);
        break;
      }
    }
  }
  std::sort(set.begin(), set.end());
  return fmt::format("transport variables: {}", set.empty() ? "none set" : fmt::format("{}", fmt::join(set, " ")));
}

bool transport_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  const std::string what = std::string(name) == "MESHTRAIN_SHM"
                               ? "1 (the default: shared memory between ranks on one host) or 0 (Gloo only)"
                               : "1 (the default: one-copy all_to_all where the ranks may read each other's memory) "
                                 "or 0 (through the segments)";
  throw std::invalid_argument(fmt::format("{}='{}': use {}", name, v, what));
}

void check_transport_variables() {
  transport_switch("MESHTRAIN_SHM");
  transport_switch("MESHTRAIN_SHM_CMA");
}

}  // namespace meshtrain
