// A range of a row-major tensor's flattened elements, as boxes.
//
// ZeRO owns contiguous ranges of flat buffers (parallel/data/zero.h), so a
// rank's part of one parameter is a range [begin, end) of its flattened
// elements, which in general is not a box of the parameter's shape. It is a
// union of at most 2 d - 1 boxes for a d-dimensional shape: a partial row at
// each end (recursively) and whole rows between. Checkpoints store boxes
// (checkpoint.h), so ZeRO writes and reads its slices as these boxes, and a
// reader streaming a shard in chunks of its flat bytes copies each chunk's
// boxes.
//
// Invariant: the boxes are in flat order, disjoint, and each one's elements
// are contiguous in the flat order, starting at `start`: box k is the range
// [start_k, start_k + volume_k), and the ranges tile [begin, end).
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain::ckpt {

struct FlatBox {
  std::vector<int64_t> offsets, shape;
  int64_t start = 0;  // flat index of the box's first element
};

// The boxes covering elements [begin, end) of a tensor of `shape` (0 <= begin
// <= end <= volume). A 0-dimensional shape has one element.
std::vector<FlatBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

}  // namespace meshtrain::ckpt
