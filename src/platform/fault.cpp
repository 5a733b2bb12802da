#include "meshtrain/platform/fault.h"

#include <atomic>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace meshtrain {
namespace {

struct Fault {
  std::string kind;  // "" (none, or not on this rank), "nan", "perturb"
  int64_t layer = -1, step = -1;
};

int64_t number(const std::string& w, size_t from, const std::string& value) {
  const std::string n = w.substr(from);
  if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) {
    throw std::invalid_argument("MESHTRAIN_FAULT='" + value + "': '" + w + "' needs a number >= 0");
  }
  return std::atoll(n.c_str());
}

Fault parse(const char* v) {
  Fault f;
  if (v == nullptr) return f;
  const std::string value(v);
  const auto bad = [&](const std::string& what) {
    return std::invalid_argument("MESHTRAIN_FAULT='" + value + "': " + what +
                                 "; use \"nan layer=L step=S [rank=R]\" or \"perturb step=S [rank=R]\", or unset it");
  };
  std::istringstream words(value);
  words >> f.kind;
  if (f.kind != "nan" && f.kind != "perturb") throw bad("unknown fault '" + f.kind + "'");
  bool here = true;
  for (std::string w; words >> w;) {
    if (w.rfind("layer=", 0) == 0) {
      f.layer = number(w, 6, value);
    } else if (w.rfind("step=", 0) == 0) {
      f.step = number(w, 5, value);
    } else if (w.rfind("rank=", 0) == 0) {
      const char* rank = std::getenv("RANK");
      here = std::string(rank ? rank : "0") == w.substr(5);
    } else {
      throw bad("unknown word '" + w + "'");
    }
  }
  if (f.step < 1) throw bad("it needs step=S with S >= 1");
  if (f.kind == "nan" && f.layer < 0) throw bad("it needs layer=L");
  if (!here) f.kind.clear();
  return f;
}

const Fault& fault() {
  static const Fault f = parse(std::getenv("MESHTRAIN_FAULT"));
  return f;
}

std::atomic<int64_t> current_step{0};

}  // namespace

void set_fault_step(int64_t step) {
  fault();  // a malformed value fails at the first step, not in the middle of a forward
  current_step = step;
}

bool fault_nan_in_layer(int64_t layer) {
  const Fault& f = fault();
  return f.kind == "nan" && f.layer == layer && f.step == current_step;
}

bool fault_perturb_after(int64_t step) {
  const Fault& f = fault();
  return f.kind == "perturb" && f.step == step;
}

}  // namespace meshtrain
