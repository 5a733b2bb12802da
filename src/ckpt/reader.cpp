// Loading a sharded checkpoint onto any mesh (see checkpoint.h).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "ckpt/files.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/flat_boxes.h"
#include "meshtrain/ckpt/pin.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/peft/nf4.h"
#include "meshtrain/plan/spec_json.h"
#include "meshtrain/ckpt/safetensors.h"

namespace fs = std::filesystem;

namespace meshtrain::ckpt {

struct Reader::Files {
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open;
  std::set<std::pair<std::string, std::string>> verified;  // (file, tensor)
};

std::optional<std::string> latest(const std::string& dir) {
  if (!fs::is_directory(dir)) return std::nullopt;
  int64_t best = -1;
  std::string path;
  for (const auto& e : fs::directory_iterator(dir)) {
    int64_t s = 0;
    if (parse_step_dir(e.path().filename().string(), s) && s > best && fs::exists(e.path() / "manifest.json")) {
      best = s;
      path = e.path().string();
    }
  }
  if (best < 0) return std::nullopt;
  return path;
}

std::optional<std::string> latest_verified(const std::string& dir, std::vector<std::string>* skipped) {
  if (!fs::is_directory(dir)) return std::nullopt;
  std::vector<std::pair<int64_t, std::string>> complete;
  for (const auto& e : fs::directory_iterator(dir)) {
    int64_t s = 0;
    if (parse_step_dir(e.path().filename().string(), s) && fs::exists(e.path() / "manifest.json")) {
      complete.emplace_back(s, e.path().string());
    }
  }
  std::sort(complete.rbegin(), complete.rend());
  for (const auto& [step, path] : complete) {
    const VerifyReport r = verify(path);
    if (r.problems.empty()) return path;
    if (skipped) skipped->push_back(fmt::format("{}: {}", path, r.problems[0]));
  }
  return std::nullopt;
}

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  if (auto l = latest(path)) return *l;
  throw std::runtime_error(fmt::format("{} is neither a checkpoint (no manifest.json) nor a directory of complete "
                                       "checkpoints (step_NNNNNNNN/manifest.json)",
                                       path));
}

// A shard's name in its file: the tensor's, or "key" when one rank wrote
// several boxes of the tensor (ZeRO's ranges, flat_boxes.h).
std::string entry_key(const nlohmann::json& shard, const std::string& name) {
  return shard.contains("key") ? shard["key"].get<std::string>() : name;
}

// Each shard's tensor in its file has the manifest's box shape and dtype.
void check_shard_entries(const nlohmann::json& m, const std::string& dir,
                         const std::map<std::string, std::unique_ptr<SafetensorsFile>>& open) {
  for (const auto& [name, t] : m["tensors"].items()) {
    const at::ScalarType dtype = dtype_from_name(t["dtype"].get<std::string>());
    for (const auto& sh : t["shards"]) {
      const auto it = open.find(sh["file"].get<std::string>());
      if (it == open.end()) continue;
      const SafetensorsFile& f = *it->second;
      const std::string key = entry_key(sh, name);
      if (!f.has(key)) {
        throw std::runtime_error(fmt::format("checkpoint {}: {} holds no tensor '{}' (the manifest says it does)",
                                             dir, f.path(), key));
      }
      const auto& e = f.entries().at(key);
      const auto box = sh["shape"].get<std::vector<int64_t>>();
      if (e.shape != box || e.dtype != dtype) {
        throw std::runtime_error(fmt::format("checkpoint {}: tensor '{}' in {} is {} [{}], the manifest says {} [{}]",
                                             dir, name, f.path(), dtype_name(e.dtype), fmt::join(e.shape, ", "),
                                             dtype_name(dtype), fmt::join(box, ", ")));
      }
    }
  }
}

Reader::Reader(const std::string& step_dir, int64_t staging_bytes)
    : dir_(step_dir), files_(std::make_unique<Files>()), staging_(staging_bytes) {
  if (staging_ < 1) throw std::invalid_argument(fmt::format("checkpoint staging buffer of {} bytes", staging_));
  const fs::path m = fs::path(step_dir) / "manifest.json";
  if (!fs::exists(m)) {
    throw std::runtime_error(fmt::format("{} has no manifest.json: not a complete checkpoint", step_dir));
  }
  try {
    manifest_ = nlohmann::json::parse(read_file(m.string()));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{} is not valid JSON: {}", m.string(), e.what()));
  }
  if (!manifest_.is_object() || !manifest_.contains("format") || manifest_["format"] != "meshtrain-checkpoint") {
    throw std::runtime_error(fmt::format("{} is not a meshtrain checkpoint manifest", m.string()));
  }
  try {
    validate_manifest(manifest_, m.string());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("{} (a damaged or foreign manifest; not loaded)", e.what()));
  }
  // Open every shard file now: a missing or truncated file is an error before
  // anything is loaded.
  for (const auto& [name, t] : manifest_["tensors"].items()) {
    for (const auto& s : t["shards"]) {
      const std::string file = s["file"];
      if (files_->open.count(file)) continue;
      const fs::path p = fs::path(step_dir) / file;
      if (!fs::exists(p)) {
        throw std::runtime_error(fmt::format("checkpoint {} is missing {} (holding '{}' among others)", step_dir,
                                             file, name));
      }
      files_->open[file] = std::make_unique<SafetensorsFile>(p.string());
    }
  }
  check_shard_entries(manifest_, step_dir, files_->open);
}

Reader::~Reader() = default;

bool Reader::has(const std::string& name) const { return manifest_["tensors"].contains(prefix_ + name); }

std::vector<int64_t> Reader::global_shape(const std::string& name) const {
  if (!has(name)) throw std::runtime_error(fmt::format("checkpoint {} holds no tensor '{}'", dir_, prefix_ + name));
  return manifest_["tensors"][prefix_ + name]["shape"].get<std::vector<int64_t>>();
}

void Reader::read(const std::string& asked, const at::Tensor& dst, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& global_shape) {
  const auto stored = this->global_shape(asked);
  const std::string name = prefix_ + asked;
  const size_t nd = stored.size();
  bool shape_ok = nd == global_shape.size() && nd == static_cast<size_t>(dst.dim()) && offsets.size() == nd;
  for (size_t d = 1; shape_ok && d < nd; ++d) shape_ok = stored[d] == global_shape[d];
  if (!shape_ok) {
    throw std::runtime_error(fmt::format("checkpoint tensor '{}' has shape [{}], the model expects [{}]", name,
                                         fmt::join(stored, ", "), fmt::join(global_shape, ", ")));
  }
  // Elements of dst inside the stored extent must all be covered by shards.
  int64_t want = 1, got = 0;
  for (size_t d = 0; d < nd; ++d) want *= std::max<int64_t>(0, std::min(offsets[d] + dst.size(d), stored[d]) - offsets[d]);
  if (want != dst.numel()) dst.zero_();  // rows beyond the stored vocabulary padding
  for (const auto& s : manifest_["tensors"][name]["shards"]) {
    const auto so = s["offsets"].get<std::vector<int64_t>>();
    const auto ss = s["shape"].get<std::vector<int64_t>>();
    std::vector<int64_t> lo(nd), len(nd);
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = std::max(offsets[d], so[d]);
      len[d] = std::min(offsets[d] + dst.size(d), so[d] + ss[d]) - lo[d];
      empty |= len[d] <= 0;
    }
    if (empty) continue;
    got += copy_shard(name, s, lo, len, dst, offsets);
  }
  if (got != want) {
    throw std::runtime_error(fmt::format("checkpoint tensor '{}': shards cover {} of the {} elements asked for", name,
                                         got, want));
  }
}

// Streams shard `s` of tensor `name` in chunks of at most staging_ bytes
// (whole rows of its flat order as boxes, flat_boxes.h), copying the
// part inside the box [lo, lo + len) (global coordinates) into dst (at
// `offsets`), and releasing each chunk's mapped pages once copied: resident
// memory stays within one chunk whatever the shard's size. The first read of
// a shard streams all of it and checks its checksum (an error after the copy
// still fails the load); later reads stream only the flat span of the box.
int64_t Reader::copy_shard(const std::string& name, const nlohmann::json& s, const std::vector<int64_t>& lo,
                           const std::vector<int64_t>& len, const at::Tensor& dst, const std::vector<int64_t>& offsets) {
  const std::string file = s["file"];
  const std::string key = entry_key(s, name);
  SafetensorsFile& f = *files_->open.at(file);
  const std::string_view bytes = f.bytes(key);
  const auto& e = f.entries().at(key);
  const auto so = s["offsets"].get<std::vector<int64_t>>();
  const size_t nd = e.shape.size();
  const int64_t elem = static_cast<int64_t>(c10::elementSize(e.dtype));
  int64_t total = 1;
  std::vector<int64_t> strides(nd, 1);
  for (size_t d = nd; d-- > 0;) {
    strides[d] = total;
    total *= e.shape[d];
  }
  const bool verify = files_->verified.insert({file, key}).second;
  int64_t first = 0, last = total;  // the flat span to stream
  if (!verify) {
    first = last = 0;
    for (size_t d = 0; d < nd; ++d) {
      first += (lo[d] - so[d]) * strides[d];
      last += (lo[d] - so[d] + len[d] - 1) * strides[d];
    }
    last += 1;
  }
  Xxh64 hash;
  int64_t copied = 0;
  const int64_t chunk = std::max<int64_t>(1, staging_ / elem);
  for (int64_t c0 = first; c0 < last; c0 += chunk) {
    const int64_t c1 = std::min(last, c0 + chunk);
    const std::string_view piece = bytes.substr(static_cast<size_t>(c0 * elem), static_cast<size_t>((c1 - c0) * elem));
    if (verify) hash.update(piece.data(), piece.size());
    for (const FlatBox& b : flat_range_boxes(e.shape, c0, c1)) {
      // The part of this box inside the asked one, in shard coordinates.
      bool empty = false;
      std::vector<int64_t> from_lo(nd), n(nd);
      for (size_t d = 0; d < nd; ++d) {
        from_lo[d] = std::max(b.offsets[d], lo[d] - so[d]);
        n[d] = std::min(b.offsets[d] + b.shape[d], lo[d] - so[d] + len[d]) - from_lo[d];
        empty |= n[d] <= 0;
      }
      if (empty) continue;
      at::Tensor from = at::from_blob(const_cast<char*>(bytes.data()) + b.start * elem, b.shape,
                                      at::TensorOptions().dtype(e.dtype));
      at::Tensor to = dst;
      for (size_t d = 0; d < nd; ++d) {
        const auto dim = static_cast<int64_t>(d);
        from = from.narrow(dim, from_lo[d] - b.offsets[d], n[d]);
        to = to.narrow(dim, so[d] + from_lo[d] - offsets[d], n[d]);
      }
      to.copy_(from);
      copied += from.numel();
    }
    f.release(piece);
  }
  // The kernel maps neighbouring pages with each fault (fault-around): drop
  // everything this file has resident, not only the bytes read.
  f.release_all();
  if (verify && hash.hex() != s["xxh64"].get<std::string>()) {
    throw std::runtime_error(fmt::format("checkpoint {}: tensor '{}' in {} fails its checksum (corrupted); "
                                         "run `meshtrain ckpt verify {}`",
                                         dir_, name, file, dir_));
  }
  return copied;
}

at::Tensor Reader::read_full(const std::string& name) {
  const auto shape = global_shape(name);
  const auto& t = manifest_["tensors"][prefix_ + name];
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype_from_name(t["dtype"].get<std::string>())));
  read(name, out, std::vector<int64_t>(shape.size(), 0), shape);
  return out;
}

VerifyReport verify(const std::string& step_dir) {
  VerifyReport r;
  nlohmann::json manifest;
  const fs::path m = fs::path(step_dir) / "manifest.json";
  try {
    manifest = nlohmann::json::parse(read_file(m.string()));
  } catch (const std::exception& e) {
    r.problems.push_back(fmt::format("{}: {}", m.string(), e.what()));
    return r;
  }
  try {
    validate_manifest(manifest, m.string());
  } catch (const std::exception& e) {
    r.problems.push_back(e.what());
    return r;
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  std::set<std::string> broken;
  for (const auto& [name, t] : manifest["tensors"].items()) {
    ++r.tensors;
    for (const auto& s : t["shards"]) {
      ++r.shards;
      const std::string file = s["file"];
      if (broken.count(file)) {
        r.problems.push_back(fmt::format("{}: '{}' unreadable (file broken, above)", file, name));
        continue;
      }
      if (!files.count(file)) {
        try {
          files[file] = std::make_unique<SafetensorsFile>((fs::path(step_dir) / file).string());
        } catch (const std::exception& e) {
          broken.insert(file);
          r.problems.push_back(e.what());
          r.problems.push_back(fmt::format("{}: '{}' unreadable", file, name));
          continue;
        }
      }
      const SafetensorsFile& f = *files[file];
      const std::string key = entry_key(s, name);
      if (!f.has(key)) {
        r.problems.push_back(fmt::format("{}: tensor '{}' missing", file, key));
        continue;
      }
      if (f.entries().at(key).shape != s["shape"].get<std::vector<int64_t>>()) {
        r.problems.push_back(fmt::format("{}: tensor '{}' has shape [{}], the manifest's shard [{}]", file, key,
                                         fmt::join(f.entries().at(key).shape, ", "),
                                         fmt::join(s["shape"].get<std::vector<int64_t>>(), ", ")));
        continue;
      }
      std::string_view b = f.bytes(key);
      r.bytes += static_cast<int64_t>(b.size());
      const std::string sum = xxh64_hex(b.data(), b.size());
      f.release(b);
      if (sum != s["xxh64"].get<std::string>()) {
        r.problems.push_back(fmt::format("{}: tensor '{}' checksum {} != {} in the manifest (corrupted)", file, key,
                                         sum, s["xxh64"].get<std::string>()));
      }
    }
  }
  return r;
}

namespace {

// Adapter checkpoints on adapter checkpoints: a chain of bases this long at most.
constexpr size_t kMaxBaseChain = 8;

std::map<std::string, at::Tensor> weights_along(Reader& reader, bool adapters_only, std::vector<std::string>& chain) {
  const auto& m = reader.manifest();
  const int64_t vocab = m.contains("config") ? m["config"]["model"].value("vocab", int64_t{0}) : 0;
  std::map<std::string, at::Tensor> out, adapters;
  for (const auto& [name, t] : m["tensors"].items()) {
    if (name.rfind("model/", 0) != 0) continue;
    at::Tensor full = reader.read_full(name);
    const std::string plain = name.substr(6);
    if ((plain == "embed.weight" || plain == "head.weight") && vocab > 0 && full.size(0) > vocab) {
      full = full.narrow(0, 0, vocab);  // vocabulary padding is not part of the model
    }
    (plain.find(".lora_") != std::string::npos ? adapters : out)[plain] = full;
  }
  if (adapters_only) {
    if (adapters.empty()) throw std::runtime_error(fmt::format("{} holds no LoRA adapters", reader.dir()));
    return adapters;
  }
  if (m.contains("base") && m["base"].is_object()) {
    // An adapter checkpoint: the frozen base is its [init] weights; QLoRA's
    // block linears were those in NF4, quantised and dequantised again exactly as the run did.
    const Pin p = pinned(m["base"], reader.dir());
    const std::string here = fs::weakly_canonical(p.step_dir).string();
    if (std::find(chain.begin(), chain.end(), here) != chain.end()) {
      throw std::runtime_error(fmt::format("checkpoint {}: its bases form a cycle ({} -> {}): a checkpoint cannot be "
                                           "its own base",
                                           reader.dir(), fmt::join(chain, " -> "), here));
    }
    chain.push_back(here);
    if (chain.size() > kMaxBaseChain) {
      throw std::runtime_error(fmt::format("checkpoint {}: more than {} bases deep ({}); export a merged model and "
                                           "train from that",
                                           reader.dir(), kMaxBaseChain, fmt::join(chain, " -> ")));
    }
    Reader base(p.step_dir);
    std::set<std::string> quantized;
    if (m.contains("qlora") && m["qlora"].is_object()) {
      for (const auto& name : linear_names(spec_from_json(m.at("config").at("model")))) quantized.insert(name + ".weight");
    }
    for (auto& [name, w] : weights_along(base, false, chain)) {
      if (out.count(name)) continue;
      out[name] = quantized.count(name) ? nf4_dequantize(nf4_quantize(w, m["qlora"].at("block").get<int64_t>(),
                                                                      m["qlora"].at("double_quant").get<bool>()),
                                                         w.scalar_type())
                                        : w;
    }
  }
  if (adapters.empty()) return out;
  // Merged: W += (alpha / rank) B A (peft/lora.h), the adapters' settings from the manifest.
  if (!m.contains("lora") || !m["lora"].is_object()) {
    throw std::runtime_error(fmt::format("{} holds LoRA adapters but no \"lora\" settings to merge them with",
                                         reader.dir()));
  }
  const double scale = m["lora"].at("alpha").get<double>() / m["lora"].at("rank").get<double>();
  for (const auto& [name, a] : adapters) {
    const size_t pos = name.rfind(".lora_a");
    if (pos == std::string::npos) continue;
    const std::string base = name.substr(0, pos);
    const at::Tensor& b = adapters.at(base + ".lora_b");
    at::Tensor& w = out.at(base + ".weight");
    w = w + at::mm(b, a) * scale;
  }
  return out;
}

}  // namespace

std::map<std::string, at::Tensor> model_weights(Reader& reader, bool adapters_only) {
  std::vector<std::string> chain{fs::weakly_canonical(reader.dir()).string()};
  return weights_along(reader, adapters_only, chain);
}

void export_model(const std::string& step_dir, const std::string& out, bool force, bool adapters_only) {
  if (fs::exists(out) && !force) {
    throw std::runtime_error(fmt::format("{} exists; pass --force to replace it", out));
  }
  Reader reader(step_dir);
  const auto& m = reader.manifest();
  std::vector<NamedTensor> tensors;
  for (auto& [name, t] : model_weights(reader, adapters_only)) tensors.push_back({name, t});
  std::map<std::string, std::string> meta{{"format", "pt"}, {"producer", "meshtrain"},
                                          {"step", std::to_string(m.value("step", int64_t{0}))}};
  if (m.contains("config")) meta["model"] = m["config"]["model"].dump();
  if (adapters_only) meta["lora"] = m["lora"].dump();
  const std::string tmp = out + ".tmp";
  write_safetensors(tmp, tensors, meta);
  fs::rename(tmp, out);
}

}  // namespace meshtrain::ckpt
