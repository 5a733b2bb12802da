// Internal: the training config's keys as one table (config_keys.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

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
};

// Every key, in the order --print-config prints them (by section).
const std::vector<ConfigKey>& config_keys();
// The key called `name`, or null.
const ConfigKey* find_config_key(const std::string& name);

}  // namespace meshtrain
