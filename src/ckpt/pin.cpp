#include "meshtrain/ckpt/pin.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;

// XXH64 of dir/manifest.json; "" when it cannot be read.
std::string manifest_hash(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "manifest.json", std::ios::binary);
  if (!f) return "";
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return xxh64_hex(bytes.data(), bytes.size());
}

}  // namespace

Pin pin(const std::string& from) {
  Pin p;
  p.from = from;
  p.step_dir = fs::absolute(resolve(from)).lexically_normal().string();
  p.manifest_xxh64 = manifest_hash(p.step_dir);
  if (p.manifest_xxh64.empty()) throw std::runtime_error(fmt::format("{}: cannot read its manifest.json", p.step_dir));
  return p;
}

nlohmann::json to_json(const Pin& p) {
  return {{"from", p.from}, {"step_dir", p.step_dir}, {"manifest_xxh64", p.manifest_xxh64}};
}

Pin pinned(const nlohmann::json& field, const std::string& owner) {
  Pin p;
  p.from = field.at("from").get<std::string>();
  if (!field.contains("step_dir")) {  // written before pins: the old reading
    p.step_dir = resolve(p.from);
    return p;
  }
  p.step_dir = field.at("step_dir").get<std::string>();
  p.manifest_xxh64 = field.at("manifest_xxh64").get<std::string>();
  const std::string now = manifest_hash(p.step_dir);
  if (now.empty()) {
    throw std::runtime_error(fmt::format("checkpoint {} was trained from {} (init.from = \"{}\"), which is gone: it was "
                                         "moved or deleted; put that step back where it was (its manifest's XXH64 is "
                                         "{})",
                                         owner, p.step_dir, p.from, p.manifest_xxh64));
  }
  if (now != p.manifest_xxh64) {
    throw std::runtime_error(fmt::format("checkpoint {} was trained from {} (init.from = \"{}\"), whose manifest has "
                                         "changed since (XXH64 {}, pinned {}): those are other weights; restore that "
                                         "step as it was",
                                         owner, p.step_dir, p.from, now, p.manifest_xxh64));
  }
  return p;
}

}  // namespace meshtrain::ckpt
