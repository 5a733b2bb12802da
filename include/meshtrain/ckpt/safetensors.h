// The safetensors format (https://github.com/huggingface/safetensors), written
// and read without the Python library:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded to a
//   multiple of 8] [data]
//   header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
//            ..., "__metadata__": {"key": "string value", ...}}
//   offsets are relative to the start of the data; tensors are C-contiguous,
//   little-endian, and tile the data with no gaps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain::ckpt {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;  // CPU; made contiguous when written
};

// "F32" <-> at::kFloat, ... (F64, F16, BF16, I64, I32, I16, I8, U8, BOOL).
std::string dtype_name(at::ScalarType t);
at::ScalarType dtype_from_name(const std::string& s);

// XXH64 (seed 0) of a byte range, as 16 hex digits.
std::string xxh64_hex(const void* data, size_t size);
// The same, fed in pieces.
class Xxh64 {
 public:
  Xxh64();
  ~Xxh64();
  Xxh64(const Xxh64&) = delete;
  Xxh64& operator=(const Xxh64&) = delete;
  void update(const void* data, size_t size);
  std::string hex() const;

 private:
  void* state_;
};

// Writes `tensors` to `path` (created, or truncated) and fsyncs it. Returns the
// XXH64 of each tensor's bytes, in order. Throws std::runtime_error naming the
// path and the OS error when a write fails (disk full, file size limit).
std::vector<std::string> write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// A memory-mapped safetensors file; the header is validated on open (sizes,
// offsets inside the file, known dtypes): std::runtime_error names the file.
class SafetensorsFile {
 public:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // in the data section
  };
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  std::string_view bytes(const std::string& name) const;
  // Drops the mapped pages holding `range` (part of bytes()) from this
  // process's memory; reading them again faults them back in from the file.
  // A reader streaming a large file calls it behind itself to bound its
  // resident memory.
  void release(std::string_view range) const;
  // The same for the whole file (pages the kernel mapped around a fault too).
  void release_all() const;
  at::Tensor get(const std::string& name) const;  // a copy

 private:
  std::string path_;
  const char* map_ = nullptr;
  size_t size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace meshtrain::ckpt
