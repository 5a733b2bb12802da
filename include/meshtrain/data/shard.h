// Token shards: the on-disk form of a tokenized corpus.
//
// Layout (little-endian), size exactly 32 + N*b + 8*D bytes:
//   0   magic "MTSHARD1"            8 bytes
//   8   version (1)                 uint32
//   12  bytes per token b (2 or 4)  uint32   uint16 when the vocabulary fits, else uint32
//   16  token count N               uint64
//   24  document count D            uint64
//   32  tokens                      N x b
//   ..  document starts             D x uint64, ascending, the first 0
// Written to a temporary file and renamed into place: a shard is whole or absent.
// Read through mmap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

// Writes `tokens` (each < 2^(8*token_bytes)) with document boundaries.
// Throws std::invalid_argument for a token that does not fit, an empty shard,
// or boundaries that are not ascending from 0.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& doc_starts,
                 int token_bytes);

class ShardReader {
 public:
  // Maps the file; throws std::runtime_error naming the file and what is wrong
  // (missing, empty, wrong magic or version, truncated or oversized).
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return count_; }
  int token_bytes() const { return token_bytes_; }
  uint32_t operator[](uint64_t i) const {
    return token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                             : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Copies tokens [start, start + n) as int64 into `out`.
  void read(uint64_t start, uint64_t n, int64_t* out) const;
  std::vector<uint64_t> doc_starts() const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  const uint64_t* docs_ = nullptr;
  uint64_t count_ = 0, doc_count_ = 0;
  int token_bytes_ = 0;
};

}  // namespace meshtrain
