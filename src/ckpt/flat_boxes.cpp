#include "meshtrain/ckpt/flat_boxes.h"

#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain::ckpt {
namespace {

// Appends the boxes of [begin, end) within `shape[d:]`, each prefixed by
// `prefix` (the indices of the enclosing rows) and shifted by `base` (the flat
// index of the enclosing row's first element).
void boxes(const std::vector<int64_t>& shape, size_t d, int64_t begin, int64_t end, std::vector<int64_t>& prefix,
           int64_t base, std::vector<FlatBox>& out) {
  if (begin >= end) return;
  const size_t nd = shape.size();
  auto emit = [&](int64_t row, int64_t rows, int64_t start) {
    FlatBox b;
    b.offsets = prefix;
    b.offsets.push_back(row);
    b.shape.assign(prefix.size(), 1);
    b.shape.push_back(rows);
    for (size_t k = d + 1; k < nd; ++k) {
      b.offsets.push_back(0);
      b.shape.push_back(shape[k]);
    }
    b.start = start;
    out.push_back(std::move(b));
  };
  int64_t inner = 1;  // elements per row of dimension d
  for (size_t k = d + 1; k < nd; ++k) inner *= shape[k];
  if (d + 1 == nd) return emit(begin, end - begin, base + begin);
  auto partial = [&](int64_t row, int64_t b, int64_t e) {
    prefix.push_back(row);
    boxes(shape, d + 1, b, e, prefix, base + row * inner, out);
    prefix.pop_back();
  };
  const int64_t first = begin / inner, last = (end - 1) / inner;
  if (first == last) return partial(first, begin - first * inner, end - first * inner);
  int64_t whole_from = first;
  if (begin % inner != 0) {
    partial(first, begin % inner, inner);
    whole_from = first + 1;
  }
  const int64_t whole_to = end / inner;  // rows [whole_from, whole_to) are whole
  if (whole_to > whole_from) emit(whole_from, whole_to - whole_from, base + whole_from * inner);
  if (end % inner != 0) partial(whole_to, 0, end % inner);
}

}  // namespace

std::vector<FlatBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  int64_t volume = 1;
  for (int64_t s : shape) volume *= s;
  if (begin < 0 || begin > end || end > volume) {
    throw std::invalid_argument(fmt::format("flat range [{}, {}) is outside a tensor of {} elements", begin, end, volume));
  }
  std::vector<FlatBox> out;
  if (begin == end) return out;
  if (shape.empty()) return {FlatBox{{}, {}, 0}};
  std::vector<int64_t> prefix;
  boxes(shape, 0, begin, end, prefix, 0, out);
  return out;
}

}  // namespace meshtrain::ckpt
