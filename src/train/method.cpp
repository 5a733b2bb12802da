#include "meshtrain/train/method.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <stdexcept>

#include "meshtrain/train/config.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/objective.h"

namespace meshtrain {
namespace {

// The methods the core holds: next-token training on documents and on
// conversations (the loss mask is in the data).
std::deque<Method> core_methods() {
  Method pretrain;
  pretrain.name = "pretrain";
  pretrain.summary = "next-token loss on token shards";
  Method sft;
  sft.name = "sft";
  sft.summary = "next-token loss on the assistant tokens of conversations (tokenize chat)";
  sft.packed_info = "sft.json", sft.tokenize = "chat";
  return {pretrain, sft};
}

struct Registry {
  std::mutex mu;
  std::deque<Method> methods = core_methods();  // a deque: what find_method returned stays put
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_method(Method m) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& have : r.methods) {
    if (have.name == m.name) throw std::logic_error(fmt::format("train.method \"{}\" is registered twice", m.name));
  }
  r.methods.push_back(std::move(m));
}

const Method* find_method(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& m : r.methods) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const Method& method_named(const std::string& name) {
  if (const Method* m = find_method(name)) return *m;
  throw std::invalid_argument(fmt::format("train.method = \"{}\": use one of \"{}\"", name,
                                          fmt::join(method_names(), "\", \"")));
}

bool pairwise(const std::string& name) {
  const Method* m = find_method(name);
  return m && m->pairs;
}

std::vector<std::string> method_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& m : r.methods) out.push_back(m.name);
  return out;
}

std::vector<std::string> methods_reading(const std::string& section) {
  std::vector<std::string> out;
  for (const std::string& name : method_names()) {
    const auto& has = method_named(name).sections;
    if (std::find(has.begin(), has.end(), section) != has.end()) out.push_back("\"" + name + "\"");
  }
  return out;
}

bool reads_section(const Method& m, const std::string& section) {
  return std::find(m.sections.begin(), m.sections.end(), section) != m.sections.end() ||
         methods_reading(section).empty();
}

}  // namespace meshtrain
