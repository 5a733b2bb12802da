// Fuzz test of the checkpoint parsers (issue #15): thousands of mutations of a
// valid safetensors file and of a valid manifest, each parsed as a loader
// would. Built with AddressSanitizer and UndefinedBehaviorSanitizer (a report
// aborts the run); passes when every mutation is either refused with an
// exception or accepted and consistent: a safetensors file whose entries lie
// inside it, a manifest whose shards tile every tensor exactly.
//
// Usage: fuzz_parsers [MUTATIONS_PER_PARSER (10000)] [SEED (1)]
// Mutations are a deterministic function of the seed: a failure names the
// iteration and can be replayed.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"

namespace fs = std::filesystem;
using meshtrain::ckpt::SafetensorsFile;
using meshtrain::ckpt::validate_manifest;

namespace {

// xorshift64*: the mutation stream.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

// Numbers a hostile file would hold: signs, limits, wrap-arounds, off-by-ones.
const std::vector<std::string> kNumbers{"-1", "0", "1", "7", "-9223372036854775808", "9223372036854775807",
                                        "18446744073709551615", "18446744073709551616", "4294967296", "1e12",
                                        "1e308", "-0", "2.5", "NaN", "\"3\"", "null", "[]", "{}", "true"};

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

std::string mutate_safetensors(const std::string& good, Rng& r) {
  std::string f = good;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(f[i])) << (8 * i);
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
                                              kNumbers[r.below(kNumbers.size())]),
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
      h.replace(h.find("\"pt\""), 4, r.below(2) ? "7" : "{\"x\":[1]}");
      return safetensors_bytes(h, data);
    }
  }
}

// Opens `bytes` as a safetensors file; when accepted, every entry must lie inside the file.
void check_safetensors(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    SafetensorsFile f(path);
    uint64_t n = 0;  // accepted: the header length field is sane
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    for (const auto& [name, e] : f.entries()) {
      const std::string_view b = f.bytes(name);
      // The mapping is whole pages, so an overrun inside the last page would read zeros unseen: check the bounds.
      if (e.end < e.begin || 8 + n + e.end > bytes.size() || b.size() != e.end - e.begin) {
        throw std::logic_error("accepted an entry outside the file: " + name);
      }
      meshtrain::ckpt::xxh64_hex(b.data(), b.size());  // reads every byte: ASan sees any overrun
      f.release(b);
    }
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception&) {
    // refused: fine
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

// Every JSON node of `j` by its pointer.
void pointers(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      std::string token;  // RFC 6901 escapes: tensor names hold '/'
      for (char c : k) token += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      pointers(v, at + "/" + token, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) pointers(j[i], at + "/" + std::to_string(i), out);
  }
}

std::string mutate_manifest(const nlohmann::json& good, Rng& r) {
  nlohmann::json m = good;
  std::vector<std::string> ptrs;
  pointers(m, "", ptrs);
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
        pointers(m, "", all);
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

// An accepted manifest must describe tensors its shards tile exactly.
void check_manifest(const std::string& text) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
    validate_manifest(m, "fuzz/manifest.json");
  } catch (const std::exception&) {
    return;  // refused: fine
  }
  for (const auto& [name, t] : m["tensors"].items()) {
    const auto shape = t["shape"].get<std::vector<int64_t>>();
    __int128 volume = 1, covered = 0;
    for (int64_t d : shape) volume *= d;
    for (const auto& s : t["shards"]) {
      const std::string file = s["file"];
      if (file.find('/') != std::string::npos || file == ".." || file == "." || file.empty()) {
        throw std::logic_error("accepted shard file " + file);
      }
      const auto off = s["offsets"].get<std::vector<int64_t>>(), len = s["shape"].get<std::vector<int64_t>>();
      __int128 v = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (off.at(d) < 0 || len.at(d) < 0 || off[d] + len[d] > shape[d]) throw std::logic_error("accepted a shard outside " + name);
        v *= len[d];
      }
      covered += v;
    }
    if (covered != volume) throw std::logic_error("accepted shards that do not tile " + name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 10000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_fuzz_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "f.safetensors").string();
  const std::string good = valid_safetensors();
  const nlohmann::json manifest = valid_manifest();
  int rc = 0;
  try {
    check_safetensors(file, good);
    const SafetensorsFile opened(file);  // the unmutated file must open
    if (opened.entries().size() != 3) throw std::runtime_error("the valid file lost entries");
    validate_manifest(manifest, "valid");
    for (long i = 0; i < n; ++i) {
      Rng r{seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i) + 1};
      try {
        check_safetensors(file, mutate_safetensors(good, r));
        check_manifest(mutate_manifest(manifest, r));
      } catch (const std::logic_error& e) {
        std::fprintf(stderr, "fuzz_parsers: mutation %ld (seed %llu): %s\n", i, static_cast<unsigned long long>(seed),
                     e.what());
        rc = 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_parsers: the valid inputs were refused: %s\n", e.what());
    rc = 1;
  }
  fs::remove_all(dir);
  if (rc == 0) std::printf("fuzz_parsers: %ld mutations of a safetensors file and of a manifest: no crash, no bad accept\n", n);
  return rc;
}
