#include "meshtrain/rl/environment.h"

#include <fmt/format.h>

#include <cctype>
#include <stdexcept>

namespace meshtrain {

bool calculate(const std::string& e, int64_t& value) {
  // Sum of terms, each a product of numbers: read left to right.
  __int128 sum = 0, term = 0;
  int sign = 1;
  size_t i = 0;
  const __int128 limit = static_cast<__int128>(INT64_MAX);
  while (true) {
    // A term: number (* number)*.
    term = 1;
    while (true) {
      if (i >= e.size() || !std::isdigit(static_cast<unsigned char>(e[i]))) return false;
      __int128 n = 0;
      for (; i < e.size() && std::isdigit(static_cast<unsigned char>(e[i])); ++i) {
        n = n * 10 + (e[i] - '0');
        if (n > limit) return false;
      }
      term *= n;
      if (term > limit) return false;
      if (i < e.size() && e[i] == '*') {
        ++i;
        continue;
      }
      break;
    }
    sum += sign * term;
    if (sum > limit || sum < -limit) return false;
    if (i == e.size()) break;
    if (e[i] != '+' && e[i] != '-') return false;
    sign = e[i] == '+' ? 1 : -1;
    ++i;
  }
  value = static_cast<int64_t>(sum);
  return true;
}

EnvReply Calculator::step(const TaskExample&, const std::string& turn, bool ended) {
  if (ended) return {"", true};
  if (turn.empty() || turn.back() != '=') return {"", false};  // cut at max_new: the policy goes on
  int64_t v = 0;
  if (!calculate(turn.substr(0, turn.size() - 1), v)) return {"err:", false};
  return {std::to_string(v) + ":", false};
}

std::unique_ptr<Environment> make_environment(const std::string& name) {
  if (name.empty()) return nullptr;
  if (name == "calculator") return std::make_unique<Calculator>();
  throw std::invalid_argument(fmt::format("environment \"{}\": use \"calculator\" (or none for single-turn rollouts)", name));
}

}  // namespace meshtrain
