// Fuzz targets: the checkpoint parsers (a safetensors file; a manifest read by
// ckpt::Reader over real shard files). See fuzz.h.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "fuzz.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"

namespace fs = std::filesystem;
using meshtrain::ckpt::SafetensorsFile;

namespace {

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

// A valid file: two tensors and metadata.
std::string valid_safetensors() {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"I64","shape":[2],"data_offsets":[24,40]},)"
      R"("c":{"dtype":"BF16","shape":[0,4],"data_offsets":[40,40]},"__metadata__":{"format":"pt"}})";
  std::string data(40, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 37);
  return safetensors_bytes(header, data);
}

// Replaces the k-th run of digits (with its sign) in `text` by `by`.
std::string replace_number(const std::string& text, size_t k, const std::string& by) {
  size_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!isdigit(static_cast<unsigned char>(text[i]))) continue;
    size_t b = i > 0 && text[i - 1] == '-' ? i - 1 : i, e = i;
    while (e < text.size() && isdigit(static_cast<unsigned char>(text[e]))) ++e;
    if (seen++ == k) return text.substr(0, b) + by + text.substr(e);
    i = e;
  }
  return text;
}

size_t count_numbers(const std::string& text) {
  size_t n = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!isdigit(static_cast<unsigned char>(text[i]))) continue;
    ++n;
    while (i < text.size() && isdigit(static_cast<unsigned char>(text[i]))) ++i;
  }
  return n;
}

std::string mutate_safetensors(const std::string& good, fuzz::Rng& r) {
  std::string f = good;
  uint64_t n = 0;
  if (f.size() < 8) return f;  // no header left to mutate: the byte mutator's turn
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(f[i])) << (8 * i);
  if (n > f.size() - 8) return f;
  std::string header = f.substr(8, n), data = f.substr(8 + n);
  switch (r.below(8)) {
    case 0:  // bit flips anywhere
      for (size_t k = 0, m = 1 + r.below(8); k < m; ++k) f[r.below(f.size())] ^= static_cast<char>(1 << r.below(8));
      return f;
    case 1: {  // the header length
      const uint64_t lengths[] = {0, 1, n - 1, n + 1, n + 8, f.size() - 8, f.size(), UINT64_MAX, UINT64_MAX - 7,
                                  uint64_t{1} << 63, (uint64_t{100} << 20) + 1, r.next()};
      const uint64_t v = lengths[r.below(sizeof lengths / sizeof lengths[0])];
      for (int i = 0; i < 8; ++i) f[i] = static_cast<char>((v >> (8 * i)) & 0xff);
      return f;
    }
    case 2:  // truncation
      return f.substr(0, r.below(f.size()));
    case 3:  // a number of the header (sizes, offsets, shapes)
      return safetensors_bytes(replace_number(header, r.below(count_numbers(header)),
                                              fuzz::hostile_numbers()[r.below(fuzz::hostile_numbers().size())]),
                               data);
    case 4: {  // a dtype
      const char* dtypes[] = {"\"X\"", "\"\"", "\"F64\"", "\"U8\"", "\"BOOL\"", "7", "null"};
      std::string h = header;
      const size_t at = h.find("\"F32\"");
      if (at != std::string::npos) h.replace(at, 5, dtypes[r.below(7)]);
      return safetensors_bytes(h, data);
    }
    case 5: {  // a name given twice, or structure broken
      std::string h = header;
      const size_t at = h.find("\"b\":");
      if (at != std::string::npos) h[at + 1] = r.below(2) ? 'a' : '_';
      if (r.below(3) == 0) h.erase(r.below(h.size()), 1 + r.below(4));
      return safetensors_bytes(h, data);
    }
    case 6:  // data grown or shrunk
      return safetensors_bytes(header, r.below(2) ? data + std::string(r.below(64), 'x') : data.substr(0, r.below(40)));
    default: {  // metadata of another type
      std::string h = header;
      if (const size_t at = h.find("\"pt\""); at != std::string::npos) h.replace(at, 4, r.below(2) ? "7" : "{\"x\":[1]}");
      return safetensors_bytes(h, data);
    }
  }
}

// Opens `bytes` as a safetensors file; when accepted, every entry must lie inside the file.
void check_safetensors(const std::string& bytes) {
  const std::string path = fuzz::write_scratch("f.safetensors", bytes);
  SafetensorsFile f(path);
  uint64_t n = 0;  // accepted: the header length field is sane
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  for (const auto& [name, e] : f.entries()) {
    const std::string_view b = f.bytes(name);
    // The mapping is whole pages, so an overrun inside the last page would read zeros unseen: check the bounds.
    if (e.end < e.begin || 8 + n + e.end > bytes.size() || b.size() != e.end - e.begin) {
      throw fuzz::BadAccept("an entry outside the file: " + name);
    }
    meshtrain::ckpt::xxh64_hex(b.data(), b.size());  // reads every byte: ASan sees any overrun
    f.get(name);                                     // and as a tensor
    f.release(b);
  }
}

nlohmann::json valid_manifest() {
  return nlohmann::json::parse(R"({
    "format": "meshtrain-checkpoint", "version": 1, "step": 3, "world_size": 2,
    "tensors": {
      "model/w": {"dtype": "F32", "shape": [4, 6], "shards": [
        {"file": "rank_00000.safetensors", "offsets": [0, 0], "shape": [2, 6], "xxh64": "0000000000000000"},
        {"file": "rank_00001.safetensors", "offsets": [2, 0], "shape": [2, 3], "xxh64": "0000000000000000"},
        {"file": "rank_00001.safetensors", "key": "model/w#1", "offsets": [2, 3], "shape": [2, 3],
         "xxh64": "0000000000000000"}]},
      "model/b": {"dtype": "BF16", "shape": [5], "shards": [
        {"file": "rank_00000.safetensors", "offsets": [0], "shape": [5], "xxh64": "0000000000000000"}]}
    },
    "ranks": [{}, {}]})");
}

std::string mutate_manifest(const std::string& text, fuzz::Rng& r) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    return text;
  }
  if (!m.contains("tensors") || !m["tensors"].contains("model/w") || !m["tensors"]["model/w"].contains("shards") ||
      !m["tensors"]["model/w"]["shards"].is_array() || m["tensors"]["model/w"]["shards"].empty()) {
    return fuzz::mutate_json(text, r);
  }
  std::vector<std::string> ptrs;
  fuzz::json_pointers(m, "", ptrs);
  const nlohmann::json::json_pointer p(ptrs[1 + r.below(ptrs.size() - 1)]);
  const std::vector<nlohmann::json> values{-1, 0, 1, 2, 3, 7, INT64_MAX, INT64_MIN, UINT64_MAX, 1e12, 2.5, nullptr,
                                           "", "../rank_00000.safetensors", "/etc/passwd", "a/b", "..", ".",
                                           nlohmann::json::array(), nlohmann::json::array({-1, 2}),
                                           nlohmann::json::array({1, 2, 3}), nlohmann::json::object(), true, "F32",
                                           "X", "rank_00001.safetensors"};
  switch (r.below(5)) {
    case 0:
      m[p] = values[r.below(values.size())];
      break;
    case 1: {  // delete a key or an element
      const nlohmann::json::json_pointer parent = p.parent_pointer();
      const std::string last = p.back();
      if (m[parent].is_object()) m[parent].erase(last);
      else if (m[parent].is_array() && !m[parent].empty()) m[parent].erase(m[parent].begin() + std::stoi(last));
      break;
    }
    case 2: {  // duplicate a shard
      auto& shards = m["tensors"]["model/w"]["shards"];
      shards.push_back(shards[r.below(shards.size())]);
      break;
    }
    case 3: {  // several numbers at once
      for (int k = 0; k < 3; ++k) {
        std::vector<std::string> all;
        fuzz::json_pointers(m, "", all);
        const nlohmann::json::json_pointer q(all[1 + r.below(all.size() - 1)]);
        if (m[q].is_number()) m[q] = values[r.below(9)];
      }
      break;
    }
    default: {  // raw bytes of the text
      std::string t = m.dump();
      for (size_t k = 0, n = 1 + r.below(4); k < n; ++k) t[r.below(t.size())] = static_cast<char>(r.next());
      return t;
    }
  }
  return m.dump();
}

// A checkpoint step directory: real shard files (write_safetensors) that the
// valid manifest describes, checksums included.
std::string valid_checkpoint() {
  const fs::path dir = fs::path(fuzz::scratch()) / "step_00000003";
  fs::create_directories(dir);
  const at::Tensor w = at::arange(24, at::kFloat).reshape({4, 6}), b = at::arange(5, at::kFloat).to(at::kBFloat16);
  const auto s0 = meshtrain::ckpt::write_safetensors((dir / "rank_00000.safetensors").string(),
                                                     {{"model/w", w.slice(0, 0, 2).contiguous()}, {"model/b", b}});
  const auto s1 = meshtrain::ckpt::write_safetensors(
      (dir / "rank_00001.safetensors").string(),
      {{"model/w", w.slice(0, 2, 4).slice(1, 0, 3).contiguous()}, {"model/w#1", w.slice(0, 2, 4).slice(1, 3, 6).contiguous()}});
  nlohmann::json m = valid_manifest();
  auto& ws = m["tensors"]["model/w"]["shards"];
  ws[0]["xxh64"] = s0[0];
  ws[1]["xxh64"] = s1[0];
  ws[2]["xxh64"] = s1[1];
  m["tensors"]["model/b"]["shards"][0]["xxh64"] = s0[1];
  return m.dump(1);
}

// The manifest as a loader reads it (ckpt::Reader over the real shard files);
// an accepted one must describe tensors its shards tile exactly, and every
// tensor must then read whole.
void check_manifest(const std::string& text) {
  const fs::path dir = fs::path(fuzz::scratch()) / "step_00000003";
  std::ofstream(dir / "manifest.json", std::ios::trunc) << text;
  meshtrain::ckpt::Reader reader(dir.string());
  const nlohmann::json& m = reader.manifest();
  for (const auto& [name, t] : m["tensors"].items()) {
    const auto shape = t["shape"].get<std::vector<int64_t>>();
    __int128 volume = 1, covered = 0;
    for (int64_t d : shape) volume *= d;
    for (const auto& s : t["shards"]) {
      const std::string file = s["file"];
      if (file.find('/') != std::string::npos || file == ".." || file == "." || file.empty()) {
        throw fuzz::BadAccept("shard file " + file);
      }
      const auto off = s["offsets"].get<std::vector<int64_t>>(), len = s["shape"].get<std::vector<int64_t>>();
      __int128 v = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (off.at(d) < 0 || len.at(d) < 0 || off[d] + len[d] > shape[d]) throw fuzz::BadAccept("a shard outside " + name);
        v *= len[d];
      }
      covered += v;
    }
    if (covered != volume) throw fuzz::BadAccept("shards that do not tile " + name);
    reader.read_full(name);
  }
}

}  // namespace

std::vector<fuzz::Target> ckpt_targets() {
  fuzz::Target st;
  st.name = "safetensors";
  st.seeds = {valid_safetensors()};
  st.dictionary = {"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"I64\""};
  st.mutate = mutate_safetensors;
  st.run = check_safetensors;
  fuzz::Target man;
  man.name = "manifest";
  man.seeds = {valid_checkpoint()};
  man.dictionary = {"\"shards\"", "\"offsets\"", "\"shape\"", "\"file\"", "\"key\"", "\"xxh64\"", "\"dtype\"", "\"tensors\""};
  man.mutate = mutate_manifest;
  man.run = check_manifest;
  return {st, man};
}
