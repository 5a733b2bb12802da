#include "meshtrain/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain {
namespace {

constexpr char kMagic[8] = {'M', 'T', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t count;
  uint64_t docs;
};
static_assert(sizeof(Header) == kHeader, "header layout");

}  // namespace

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, const std::vector<uint64_t>& doc_starts,
                 int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw std::invalid_argument(fmt::format("token width {} bytes: use 2 (uint16) or 4 (uint32)", token_bytes));
  }
  if (tokens.empty()) throw std::invalid_argument(fmt::format("shard {} would hold no tokens", path));
  for (size_t i = 0; i < doc_starts.size(); ++i) {
    if ((i == 0 && doc_starts[0] != 0) || (i > 0 && doc_starts[i] <= doc_starts[i - 1]) || doc_starts[i] >= tokens.size()) {
      throw std::invalid_argument(fmt::format("shard {}: document starts must ascend from 0 below {}", path, tokens.size()));
    }
  }
  std::vector<unsigned char> body(tokens.size() * token_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (token_bytes == 2) {
      if (tokens[i] > 0xFFFF) {
        throw std::invalid_argument(fmt::format("token {} at {} does not fit uint16; write the shard with 4-byte tokens",
                                                tokens[i], i));
      }
      const uint16_t t = static_cast<uint16_t>(tokens[i]);
      std::memcpy(&body[2 * i], &t, 2);
    } else {
      std::memcpy(&body[4 * i], &tokens[i], 4);
    }
  }
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.token_bytes = static_cast<uint32_t>(token_bytes);
  h.count = tokens.size();
  h.docs = doc_starts.size();
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1 && std::fwrite(body.data(), 1, body.size(), f) == body.size() &&
            (doc_starts.empty() ||
             std::fwrite(doc_starts.data(), sizeof(uint64_t), doc_starts.size(), f) == doc_starts.size());
  ok = std::fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(fmt::format("writing {} failed: {}", path, std::strerror(errno)));
  }
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open token shard {}: {}", path, std::strerror(errno)));
  struct stat st {};
  fstat(fd, &st);
  map_size_ = static_cast<size_t>(st.st_size);
  auto fail = [&](const std::string& why) {
    close(fd);
    throw std::runtime_error(fmt::format("token shard {}: {}; re-create it with `meshtrain tokenize`", path, why));
  };
  if (map_size_ == 0) fail("the file is empty");
  if (map_size_ < kHeader) fail(fmt::format("{} bytes is shorter than the {}-byte header (truncated)", map_size_, kHeader));
  map_ = mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::runtime_error(fmt::format("cannot map token shard {}: {}", path, std::strerror(errno)));
  }
  Header h;
  std::memcpy(&h, map_, sizeof h);
  auto bad = [&](const std::string& why) {
    munmap(map_, map_size_);
    map_ = nullptr;
    throw std::runtime_error(fmt::format("token shard {}: {}; re-create it with `meshtrain tokenize`", path, why));
  };
  if (std::memcmp(h.magic, kMagic, 8) != 0) bad("wrong magic (not a meshtrain token shard)");
  if (h.version != kVersion) bad(fmt::format("version {} (this build reads {})", h.version, kVersion));
  if (h.token_bytes != 2 && h.token_bytes != 4) bad(fmt::format("token width {} bytes", h.token_bytes));
  const unsigned __int128 want = static_cast<unsigned __int128>(kHeader) +
                                 static_cast<unsigned __int128>(h.count) * h.token_bytes +
                                 static_cast<unsigned __int128>(h.docs) * 8;
  if (want != map_size_) {
    bad(fmt::format("header promises {} tokens and {} documents ({} bytes) but the file has {} bytes ({})",
                    h.count, h.docs, static_cast<uint64_t>(want), map_size_, want > map_size_ ? "truncated" : "trailing bytes"));
  }
  if (h.count == 0) bad("no tokens");
  token_bytes_ = static_cast<int>(h.token_bytes);
  count_ = h.count;
  doc_count_ = h.docs;
  tokens_ = static_cast<const unsigned char*>(map_) + kHeader;
  docs_ = reinterpret_cast<const uint64_t*>(tokens_ + count_ * token_bytes_);
  // The document table as write_shard makes it (readers index tokens by it): ascending from 0,
  // every start inside the tokens. Checked here, before anything reads by it.
  uint64_t prev = 0;
  for (uint64_t i = 0; i < doc_count_; ++i) {
    uint64_t start;
    std::memcpy(&start, docs_ + i, 8);  // unaligned
    if ((i == 0 && start != 0) || (i > 0 && start <= prev) || start >= count_) {
      bad(fmt::format("document {} starts at token {}: starts must ascend from 0 and lie below its {} tokens", i, start,
                      count_));
    }
    prev = start;
  }
}

ShardReader::~ShardReader() {
  if (map_) munmap(map_, map_size_);
}

void ShardReader::read(uint64_t start, uint64_t n, int64_t* out) const {
  if (start + n > count_) {
    throw std::out_of_range(fmt::format("token shard {}: read [{}, {}) past its {} tokens", path_, start, start + n, count_));
  }
  for (uint64_t i = 0; i < n; ++i) out[i] = (*this)[start + i];
}

std::vector<uint64_t> ShardReader::doc_starts() const {
  std::vector<uint64_t> d(doc_count_);
  if (doc_count_) std::memcpy(d.data(), docs_, doc_count_ * 8);  // docs_ may be unaligned: copy
  return d;
}

}  // namespace meshtrain
