#include "meshtrain/data/sp_model_check.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace meshtrain {

namespace {

struct Bad {
  std::string what;
};

// Protocol-buffer wire format (protobuf.dev/programming-guides/encoding): a
// field is a varint key (number << 3 | wire type) and a value.
class Wire {
 public:
  explicit Wire(std::string_view b) : b_(b) {}
  bool done() const { return at_ == b_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= b_.size()) throw Bad{"a truncated protobuf varint"};
      const auto c = static_cast<unsigned char>(b_[at_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if ((c & 0x80) == 0) return v;
    }
    throw Bad{"a protobuf varint longer than 10 bytes"};
  }
  // The next field: its number, and its bytes when length-delimited (others skipped).
  int field(std::string_view* bytes) {
    const uint64_t key = varint();
    const int wire = static_cast<int>(key & 7);
    *bytes = {};
    switch (wire) {
      case 0: varint(); break;
      case 1: skip(8); break;
      case 5: skip(4); break;
      case 2: {
        const uint64_t n = varint();
        if (n > b_.size() - at_) throw Bad{"a protobuf field longer than its message"};
        *bytes = b_.substr(at_, n);
        at_ += n;
        break;
      }
      default: throw Bad{fmt::format("protobuf wire type {}", wire)};
    }
    return static_cast<int>(key >> 3);
  }

 private:
  void skip(size_t n) {
    if (n > b_.size() - at_) throw Bad{"a truncated protobuf field"};
    at_ += n;
  }
  std::string_view b_;
  size_t at_ = 0;
};

// Darts-clone's unit (darts.h, DoubleArrayUnit).
bool has_leaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
uint32_t value(uint32_t u) { return u & ((1U << 31) - 1); }
uint32_t label(uint32_t u) { return u & ((1U << 31) | 0xFF); }
uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); }

void check_charsmap(std::string_view blob) {
  if (blob.empty()) return;  // no map: the identity normalizer
  uint32_t trie_bytes = 0;
  if (blob.size() < 4) throw Bad{"a character map shorter than its header"};
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes == 0 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4) {
    throw Bad{fmt::format("a character map whose trie ({} bytes) does not fit its {} bytes", trie_bytes, blob.size())};
  }
  std::vector<uint32_t> units(trie_bytes / 4);
  std::memcpy(units.data(), blob.data() + 4, trie_bytes);
  const std::string_view strings = blob.substr(4 + trie_bytes);
  if (strings.empty() || strings.back() != '\0') throw Bad{"a character map whose strings do not end in NUL"};
  // Every base reachable from the root: its 256 child slots lie inside the trie.
  const uint64_t n = units.size();
  std::vector<uint32_t> todo{offset(units[0])};
  std::vector<bool> seen(n, false);
  while (!todo.empty()) {
    const uint32_t base = todo.back();
    todo.pop_back();
    if ((uint64_t{base} | 0xff) >= n) throw Bad{"a character map whose trie points outside itself"};
    if (seen[base]) continue;
    seen[base] = true;
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t child = base ^ c, u = units[child];
      if (label(u) != c) continue;
      const uint32_t next = child ^ offset(u);
      if (has_leaf(u)) {
        if (next >= n) throw Bad{"a character map whose trie points outside itself"};
        if (value(units[next]) >= strings.size()) throw Bad{"a character map rule pointing outside its strings"};
      }
      todo.push_back(next);
    }
  }
}

void check_normalizer(std::string_view spec) {
  Wire w(spec);
  while (!w.done()) {
    std::string_view bytes;
    if (w.field(&bytes) == 2) check_charsmap(bytes);
  }
}

}  // namespace

void check_sentencepiece_model(const std::string& bytes, const std::string& path) {
  try {
    if (bytes.empty()) throw Bad{"an empty file"};
    Wire w(bytes);
    while (!w.done()) {
      std::string_view sub;
      const int f = w.field(&sub);
      if (f == 3 || f == 5) check_normalizer(sub);
    }
  } catch (const Bad& b) {
    throw std::invalid_argument(fmt::format("{} is not a usable SentencePiece model: {} (a damaged file? train one "
                                            "with meshtrain tokenize, or pass the .model it wrote)",
                                            path, b.what));
  }
}

}  // namespace meshtrain
