// The training config's keys as one table: each key declared once (name, type, allowed range,
// help line, the field it sets, and which runs read it), read by the TOML loader, --set,
// --print-config, the range checks and `meshtrain train --help-config`.
//
// The core's keys are config_keys.cpp's; a method that reads a section of its own declares that
// section's keys where it lives and registers them with its methods (dpo/method.cpp,
// rl/config_keys.cpp), its values
// in its own struct (TrainConfig::settings). The builders below make a key from a field accessor:
// a generic lambda [](auto& c) -> auto& { return c.member; }, called with TrainConfig& to set and
// with const TrainConfig& to show.
#pragma once

#include <deque>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml.hpp>  // third_party/tomlplusplus (see its README.md)

#include "meshtrain/train/config.h"

namespace meshtrain {

// One key: what it is called, its type and allowed range as a user reads them,
// one line of help, and how to set it from a TOML value (checking type and
// range, std::invalid_argument naming the key) and show it as TOML.
struct ConfigKey {
  std::string name;   // "train.lr"
  std::string type;   // "integer", "number", "bool", "string", "strings"
  std::string range;  // "> 0", "at least 1", "0..3", "sigmoid | ipo | hinge", "" (any)
  std::string help;
  std::function<void(TrainConfig&, const toml::node&)> set;
  std::function<std::string(const TrainConfig&)> show;
  // Empty for a key every run reads; else, for a run that does not read it, why and what would
  // (for a run that does: ""). A key set away from its default that the run does not read is one
  // error (load_train_config), not a setting silently without effect.
  std::function<std::string(const TrainConfig&)> unread;
};

// Every key, in the order --print-config prints them (by section): the core's, then the
// registered ones in registration order.
const std::deque<ConfigKey>& config_keys();
// The key called `name`, or null.
const ConfigKey* find_config_key(const std::string& name);
// Adds a method's keys (before any config is loaded); std::logic_error when a name is taken.
void register_config_keys(std::vector<ConfigKey> keys);

namespace config_key {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] inline void wrong_type(const std::string& key, const char* want) {
  throw std::invalid_argument(fmt::format("config key {} must be {}", key, want));
}
inline int64_t as_int(const toml::node& n, const std::string& key) {
  if (auto v = n.value_exact<int64_t>()) return *v;
  wrong_type(key, "an integer");
}
inline double as_double(const toml::node& n, const std::string& key) {
  if (auto v = n.value<double>(); v && (n.is_floating_point() || n.is_integer())) {
    // TOML spells nan and inf; no key of a training config means them (lr = nan would train to NaN).
    if (!std::isfinite(*v)) throw std::invalid_argument(fmt::format("config key {} = {} must be a finite number", key, *v));
    return *v;
  }
  wrong_type(key, "a number");
}
inline bool as_bool(const toml::node& n, const std::string& key) {
  if (auto v = n.value_exact<bool>()) return *v;
  wrong_type(key, "true or false");
}
inline std::string as_string(const toml::node& n, const std::string& key) {
  if (auto v = n.value_exact<std::string>()) return *v;
  wrong_type(key, "a string");
}
inline std::vector<std::string> as_strings(const toml::node& n, const std::string& key) {
  if (n.is_string()) return {as_string(n, key)};
  std::vector<std::string> out;
  if (auto arr = n.as_array()) {
    for (const auto& e : *arr) out.push_back(as_string(e, key));
    return out;
  }
  wrong_type(key, "a string or a list of strings");
}

inline std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) out += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
  return out + "\"";
}

template <class F>
using FieldType = std::remove_reference_t<decltype(std::declval<F>()(std::declval<TrainConfig&>()))>;

[[noreturn]] inline void out_of_range(const std::string& key, const std::string& value, const ConfigKey& k) {
  throw std::invalid_argument(fmt::format("{} = {} must be {} ({})", key, value, k.range, k.help));
}

// An integer in [lo, hi].
template <class F>
ConfigKey integer(const char* name, F field, int64_t lo, int64_t hi, const char* help) {
  ConfigKey k{name, "integer", hi == kMaxInt ? fmt::format("at least {}", lo) : fmt::format("{}..{}", lo, hi), help,
              {}, {}, {}};
  k.set = [=, range = k](TrainConfig& c, const toml::node& n) {
    const int64_t v = as_int(n, name);
    if (v < lo || v > hi) out_of_range(name, std::to_string(v), range);
    field(c) = static_cast<FieldType<F>>(v);
  };
  k.show = [=](const TrainConfig& c) { return fmt::format("{}", field(c)); };
  return k;
}

// A finite number between lo and hi, each bound included unless open.
template <class F>
ConfigKey number(const char* name, F field, double lo, bool lo_open, double hi, bool hi_open, const char* help) {
  std::string range = hi == kInf ? fmt::format("{} {}", lo_open ? ">" : ">=", lo)
                                 : fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  ConfigKey k{name, "number", range, help, {}, {}, {}};
  k.set = [=, range = k](TrainConfig& c, const toml::node& n) {
    const double v = as_double(n, name);
    if (v < lo || v > hi || (lo_open && v == lo) || (hi_open && v == hi)) out_of_range(name, fmt::format("{}", v), range);
    field(c) = v;
  };
  k.show = [=](const TrainConfig& c) { return fmt::format("{}", field(c)); };
  return k;
}

template <class F>
ConfigKey boolean(const char* name, F field, const char* help) {
  ConfigKey k{name, "bool", "", help, {}, {}, {}};
  k.set = [=](TrainConfig& c, const toml::node& n) { field(c) = as_bool(n, name); };
  k.show = [=](const TrainConfig& c) { return field(c) ? "true" : "false"; };
  return k;
}

// A string; `choices` documents the values the config's checks accept.
template <class F>
ConfigKey text(const char* name, F field, const char* choices, const char* help) {
  ConfigKey k{name, "string", choices, help, {}, {}, {}};
  k.set = [=](TrainConfig& c, const toml::node& n) { field(c) = as_string(n, name); };
  k.show = [=](const TrainConfig& c) { return toml_string(field(c)); };
  return k;
}

template <class F>
ConfigKey texts(const char* name, F field, const char* help) {
  ConfigKey k{name, "strings", "", help, {}, {}, {}};
  k.set = [=](TrainConfig& c, const toml::node& n) { field(c) = as_strings(n, name); };
  k.show = [=](const TrainConfig& c) {
    std::vector<std::string> q;
    for (const auto& s : field(c)) q.push_back(toml_string(s));
    return fmt::format("[{}]", fmt::join(q, ", "));
  };
  return k;
}

// A list of integers, each at least `lo`.
template <class F>
ConfigKey integers(const char* name, F field, int64_t lo, const char* help) {
  ConfigKey k{name, "integers", fmt::format("each at least {}", lo), help, {}, {}, {}};
  k.set = [=, range = k](TrainConfig& c, const toml::node& n) {
    const toml::array* arr = n.as_array();
    if (!arr) wrong_type(name, "a list of integers");
    std::vector<int64_t> out;
    for (const auto& e : *arr) {
      const int64_t v = as_int(e, name);
      if (v < lo) out_of_range(name, std::to_string(v), range);
      out.push_back(v);
    }
    field(c) = std::move(out);
  };
  k.show = [=](const TrainConfig& c) { return fmt::format("[{}]", fmt::join(field(c), ", ")); };
  return k;
}

// An enumeration spelled as a string: `parse` names the bad value, `name` the good one.
template <class F, class P, class N>
ConfigKey choice(const char* name, F field, P parse, N show_name, const char* choices, const char* help) {
  ConfigKey k{name, "string", choices, help, {}, {}, {}};
  k.set = [=](TrainConfig& c, const toml::node& n) {
    const std::string s = as_string(n, name);
    try {
      field(c) = parse(s);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{} = {}: {}", name, toml_string(s), e.what()));
    }
  };
  k.show = [=](const TrainConfig& c) { return toml_string(show_name(field(c))); };
  return k;
}


}  // namespace config_key
}  // namespace meshtrain
