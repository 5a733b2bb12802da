#include "meshtrain/comm/transport_env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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

}  // namespace meshtrain
