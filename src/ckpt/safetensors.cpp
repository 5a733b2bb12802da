#include "meshtrain/ckpt/safetensors.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace meshtrain::ckpt {
namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_table() {
  static const std::vector<std::pair<at::ScalarType, const char*>> t{
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
      {at::kInt, "I32"},   {at::kShort, "I16"},  {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};
  return t;
}

// Writes all of [data, data+size) at the file's current position.
void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(fmt::format("writing {} failed: {}", path, std::strerror(errno)));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& [s, n] : dtype_table())
    if (s == t) return n;
  throw std::invalid_argument(fmt::format("dtype {} has no safetensors name", c10::toString(t)));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [s, n] : dtype_table())
    if (name == n) return s;
  throw std::invalid_argument(fmt::format("unknown safetensors dtype '{}'", name));
}

std::string xxh64_hex(const void* data, size_t size) { return fmt::format("{:016x}", XXH64(data, size, 0)); }

std::vector<std::string> write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      throw std::invalid_argument(fmt::format("{}: duplicate or reserved tensor name '{}'", path, t.name));
    }
    at::Tensor c = t.tensor.cpu().contiguous();  // a CUDA run writes from the host
    const uint64_t bytes = c.numel() * c.element_size();
    header[t.name] = {{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  std::vector<std::string> sums;
  try {
    uint64_t n = h.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    write_all(fd, len, 8, path);
    write_all(fd, h.data(), h.size(), path);
    for (const auto& c : data) {
      const size_t bytes = c.numel() * c.element_size();
      const char* p = static_cast<const char*>(c.data_ptr());
      sums.push_back(xxh64_hex(p, bytes));
      write_all(fd, p, bytes, path);
    }
    if (::fsync(fd) != 0) throw std::runtime_error(fmt::format("fsync {} failed: {}", path, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw std::runtime_error(fmt::format("closing {} failed: {}", path, std::strerror(errno)));
  return sums;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw std::runtime_error(fmt::format("{} is truncated ({} bytes): not a safetensors file", path, size_));
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw std::runtime_error(fmt::format("cannot map {}: {}", path, std::strerror(errno)));
  map_ = static_cast<const char*>(m);
  try {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(map_[i])) << (8 * i);
    if (n > size_ - 8) throw std::runtime_error(fmt::format("header of {} bytes runs past the end", n));
    // The format's own limit (100 MB, as the reference implementation): a larger header is not a checkpoint's.
    if (n > (uint64_t{100} << 20)) throw std::runtime_error(fmt::format("header of {} bytes exceeds 100 MB", n));
    data_start_ = 8 + n;
    // A name given twice would be read as its last entry: refuse it (the parser's callback sees every key).
    std::set<std::string> names;
    std::string twice;
    auto keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second) {
        twice = parsed.get<std::string>();
      }
      return true;
    };
    nlohmann::json header = nlohmann::json::parse(map_ + 8, map_ + 8 + n, keys);
    if (!twice.empty()) throw std::runtime_error(fmt::format("tensor '{}' appears twice in the header", twice));
    for (const auto& [name, e] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : e.items()) metadata_[k] = v.get<std::string>();
        continue;
      }
      Entry en;
      en.dtype = dtype_from_name(e.at("dtype").get<std::string>());
      en.shape = e.at("shape").get<std::vector<int64_t>>();
      en.begin = e.at("data_offsets").at(0).get<uint64_t>();
      en.end = e.at("data_offsets").at(1).get<uint64_t>();
      uint64_t numel = 1;
      for (int64_t d : en.shape) {
        // Sizes must be non-negative and their product must fit the file (no wrap-around).
        if (d < 0 || (d > 0 && numel > size_ / static_cast<uint64_t>(d))) {
          throw std::runtime_error(fmt::format("tensor '{}' has shape [{}]: not a size this file can hold", name,
                                               fmt::join(en.shape, ", ")));
        }
        numel *= static_cast<uint64_t>(d);
      }
      if (en.end < en.begin || en.end - en.begin != numel * c10::elementSize(en.dtype)) {
        throw std::runtime_error(fmt::format("tensor '{}' has offsets [{}, {}) that do not fit its shape", name,
                                             en.begin, en.end));
      }
      if (en.end > size_ - data_start_) {  // (written so that a huge offset cannot wrap around)
        throw std::runtime_error(fmt::format("tensor '{}' ends at byte {} but the file has {} (truncated?)", name,
                                             data_start_ + en.end, size_));
      }
      entries_[name] = en;
    }
  } catch (const std::exception& e) {
    ::munmap(const_cast<char*>(map_), size_);
    throw std::runtime_error(fmt::format("{} is not a valid safetensors file: {}", path, e.what()));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<char*>(map_), size_);
}

std::string_view SafetensorsFile::bytes(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::runtime_error(fmt::format("{} holds no tensor '{}'", path_, name));
  return {map_ + data_start_ + it->second.begin, it->second.end - it->second.begin};
}

void SafetensorsFile::release(std::string_view range) const {
  if (range.empty() || !map_) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(range.data()) / page * page;
  const uintptr_t end = std::min(reinterpret_cast<uintptr_t>(map_) + size_,
                                 (reinterpret_cast<uintptr_t>(range.data()) + range.size() + page - 1) / page * page);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: failure only costs memory
}

void SafetensorsFile::release_all() const {
  if (map_) ::madvise(const_cast<char*>(map_), size_, MADV_DONTNEED);
}

Xxh64::Xxh64() : state_(XXH64_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH64_reset(static_cast<XXH64_state_t*>(state_), 0);
}
Xxh64::~Xxh64() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }
void Xxh64::update(const void* data, size_t size) { XXH64_update(static_cast<XXH64_state_t*>(state_), data, size); }
std::string Xxh64::hex() const { return fmt::format("{:016x}", XXH64_digest(static_cast<XXH64_state_t*>(state_))); }

at::Tensor SafetensorsFile::get(const std::string& name) const {
  std::string_view b = bytes(name);
  const Entry& e = entries_.at(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (!b.empty()) std::memcpy(t.data_ptr(), b.data(), b.size());  // an empty tensor has no data pointer
  return t;
}

}  // namespace meshtrain::ckpt
