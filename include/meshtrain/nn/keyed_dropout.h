// Dropout masks that are keyed, not drawn: counter-based randomness (Salmon et al., "Parallel
// Random Numbers: As Easy as 1, 2, 3", SC'11 — what cuRAND's Philox and JAX's threefry do).
//
// Invariant: an element's keep bit is a pure function of (key, its global coordinates). The key
// names the draw (seed, optimizer step, layer, site); the coordinates say which element it is in
// the unsplit tensor (the row's place in the global batch, the position in the sequence, the
// feature, the head). So a mask does not depend on how the tensor is split over ranks (dp, tp,
// sp, pp, micro-batches), on the order of draws, or on a generator's state: every mesh drops
// what one process drops, recomputation replays it, and a resume on another mesh is exact with
// nothing saved.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace meshtrain::nn {

// splitmix64's finaliser (Steele et al., OOPSLA'14) of key + golden-ratio x (value + 1): chaining
// it over the coordinates hashes a tuple, and consecutive values are splitmix64's own stream.
uint64_t key_mix(uint64_t key, uint64_t value);

// The global coordinate of each local index of one dimension.
using Coords = std::vector<int64_t>;
Coords span(int64_t first, int64_t n);  // first, first + 1, ..., first + n - 1

// The keep mask [dims[0].size(), dims[1].size(), ...], 1 or 0 in `like`'s dtype and on its
// device: element (i0, i1, ...) is kept iff the top 53 bits of
// key_mix(...key_mix(key, dims[0][i0])..., dims[n-1][in-1]) are >= floor(p 2^53) (a uniform >= p).
at::Tensor keyed_keep(uint64_t key, double p, const std::vector<Coords>& dims, const at::Tensor& like);

// What a model's dropout sites share while one micro-batch runs: the run's seed, the optimizer
// step, and the micro-batch's first row in the step's global batch (data/loader.h's
// Batch::first_row); a site's key adds its own two names (a layer and a kind, or an adapter).
struct DropoutKeys {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_row = 0;
  uint64_t key(uint64_t a, uint64_t b) const;
  Coords rows(int64_t n) const { return span(first_row, n); }
};

// Inverted dropout with that mask: x * keep / (1 - p); `dims` must match x's shape.
at::Tensor keyed_dropout(const at::Tensor& x, double p, uint64_t key, const std::vector<Coords>& dims);

}  // namespace meshtrain::nn
