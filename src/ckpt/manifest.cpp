// Validating a checkpoint manifest before any file is opened (checkpoint.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/safetensors.h"

namespace meshtrain::ckpt {

namespace {

using Box = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // offsets, shape (non-empty)

// Calls overlap(a, b) for a pair of boxes that intersect, if any. A sweep along the dimension
// the boxes are split most often: sorted by their start there, each box is compared with the
// boxes still open at its start only. Shards of a checkpoint are a grid (tp, ZeRO, pp splits),
// so that is a few boxes each: O(n log n + n·k) for k splits of the other dimensions, where
// comparing every pair took O(n²) (10⁵ shards: minutes).
void check_disjoint(const std::vector<Box>& boxes, const std::function<void(size_t, size_t)>& overlap) {
  if (boxes.size() < 2) return;
  const size_t dims = boxes[0].first.size();
  size_t axis = 0, most = 0;
  for (size_t d = 0; d < dims; ++d) {
    std::vector<int64_t> starts;
    for (const auto& b : boxes) starts.push_back(b.first[d]);
    std::sort(starts.begin(), starts.end());
    const auto distinct = static_cast<size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
    if (distinct > most) most = distinct, axis = d;
  }
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return boxes[a].first[axis] < boxes[b].first[axis]; });
  std::vector<size_t> open;
  for (size_t i : order) {
    const int64_t start = boxes[i].first[axis];
    std::erase_if(open, [&](size_t j) { return boxes[j].first[axis] + boxes[j].second[axis] <= start; });
    for (size_t j : open) {
      bool meet = true;
      for (size_t d = 0; meet && d < dims; ++d) {
        meet = std::max(boxes[i].first[d], boxes[j].first[d]) <
               std::min(boxes[i].first[d] + boxes[i].second[d], boxes[j].first[d] + boxes[j].second[d]);
      }
      if (meet) overlap(i, j);
    }
    open.push_back(i);
  }
}

}  // namespace

void validate_manifest(const nlohmann::json& m, const std::string& path) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(fmt::format("{}: {}", path, what));
  };
  if (!m.contains("tensors") || !m["tensors"].is_object() || m["tensors"].empty()) {
    fail("\"tensors\" must be a non-empty object of the checkpoint's tensors");
  }
  auto ints = [&](const nlohmann::json& j, const std::string& field) {
    if (!j.is_array()) fail(fmt::format("{} must be an array of integers", field));
    std::vector<int64_t> v;
    for (const auto& x : j) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) fail(fmt::format("{} holds {}, not a size", field, x.dump()));
      v.push_back(x.get<int64_t>());
    }
    return v;
  };
  for (const auto& [name, t] : m["tensors"].items()) {
    const std::string where = fmt::format("tensor '{}'", name);
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t.contains("shards") || !t["shards"].is_array() || t["shards"].empty()) {
      fail(where + " needs \"dtype\", \"shape\" and a non-empty \"shards\" list");
    }
    at::ScalarType dtype;
    try {
      dtype = dtype_from_name(t["dtype"].get<std::string>());
    } catch (const std::exception& e) {
      fail(fmt::format("{}: dtype: {}", where, e.what()));
    }
    const std::vector<int64_t> shape = ints(t["shape"], where + " shape");
    // The whole tensor's bytes must be representable (and so must every box inside it).
    __int128 numel = 1;
    for (int64_t d : shape) {
      numel *= d;
      if (numel * static_cast<__int128>(c10::elementSize(dtype)) > static_cast<__int128>(INT64_MAX)) {
        fail(fmt::format("{} shape [{}] is larger than any file", where, fmt::join(shape, ", ")));
      }
    }
    std::vector<Box> boxes;
    __int128 covered = 0;
    for (const auto& sh : t["shards"]) {
      if (!sh.is_object() || !sh.contains("file") || !sh["file"].is_string() || !sh.contains("xxh64") ||
          !sh["xxh64"].is_string()) {
        fail(where + ": a shard needs \"file\", \"offsets\", \"shape\" and \"xxh64\"");
      }
      if (sh.contains("key") && (!sh["key"].is_string() || sh["key"].get<std::string>().empty())) {
        fail(where + ": a shard's \"key\" (its name in the file) must be a non-empty string");
      }
      const std::string file = sh["file"];
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
        fail(fmt::format("{}: shard file \"{}\" is not a plain file name in the step directory", where, file));
      }
      const auto off = ints(sh.value("offsets", nlohmann::json()), where + " shard offsets");
      const auto len = ints(sh.value("shape", nlohmann::json()), where + " shard shape");
      if (off.size() != shape.size() || len.size() != shape.size()) {
        fail(fmt::format("{}: a shard's offsets [{}] and shape [{}] must have the tensor's {} dimensions", where,
                         fmt::join(off, ", "), fmt::join(len, ", "), shape.size()));
      }
      __int128 volume = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (off[d] > shape[d] || len[d] > shape[d] - off[d]) {  // (sizes are non-negative: no overflow)
          fail(fmt::format("{}: shard at [{}] of shape [{}] lies outside the tensor's shape [{}]", where,
                           fmt::join(off, ", "), fmt::join(len, ", "), fmt::join(shape, ", ")));
        }
        volume *= len[d];
      }
      if (volume > 0) boxes.push_back({off, len});  // an empty box overlaps nothing
      covered += volume;
    }
    check_disjoint(boxes, [&](size_t a, size_t b) {
      fail(fmt::format("{}: shards at [{}] and [{}] overlap", where, fmt::join(boxes[a].first, ", "),
                       fmt::join(boxes[b].first, ", ")));
    });
    // Disjoint boxes inside the shape tile it exactly when their volumes add up to it.
    if (covered != numel) {
      fail(fmt::format("{}: shards cover {} of {} elements (shape [{}]): a gap", where,
                       static_cast<int64_t>(covered), static_cast<int64_t>(numel), fmt::join(shape, ", ")));
    }
  }
}

}  // namespace meshtrain::ckpt
