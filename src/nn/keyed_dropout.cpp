#include "meshtrain/nn/keyed_dropout.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

namespace meshtrain::nn {

uint64_t key_mix(uint64_t key, uint64_t value) {
  uint64_t z = key + 0x9E3779B97F4A7C15ULL * (value + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t DropoutKeys::key(uint64_t a, uint64_t b) const {
  const uint64_t run = key_mix(key_mix(0x64726F706F7574ULL /* "dropout" */, seed), static_cast<uint64_t>(step));
  return key_mix(key_mix(run, a), b);
}

Coords span(int64_t first, int64_t n) {
  Coords c(static_cast<size_t>(n));
  std::iota(c.begin(), c.end(), first);
  return c;
}

at::Tensor keyed_keep(uint64_t key, double p, const std::vector<Coords>& dims, const at::Tensor& like) {
  if (dims.empty()) throw std::invalid_argument("keyed_keep: a mask needs at least one dimension");
  if (!(p >= 0 && p < 1)) throw std::invalid_argument(fmt::format("keyed_keep: p = {} must be in [0, 1)", p));
  // The hash of every prefix (i0, ..., i(n-2)), then the last dimension's elements from it.
  std::vector<uint64_t> prefix{key};
  std::vector<int64_t> sizes;
  for (size_t d = 0; d + 1 < dims.size(); ++d) {
    std::vector<uint64_t> next;
    next.reserve(prefix.size() * dims[d].size());
    for (uint64_t h : prefix) {
      for (int64_t c : dims[d]) next.push_back(key_mix(h, static_cast<uint64_t>(c)));
    }
    prefix = std::move(next);
    sizes.push_back(static_cast<int64_t>(dims[d].size()));
  }
  const Coords& last = dims.back();
  const int64_t n = static_cast<int64_t>(last.size());
  sizes.push_back(n);
  at::Tensor keep = at::empty(sizes, at::kFloat);
  float* out = keep.data_ptr<float>();
  // Kept iff u >= p for u = (h >> 11) 2^-53: the threshold in the same 53-bit integers.
  const uint64_t threshold = static_cast<uint64_t>(p * 9007199254740992.0);  // p 2^53
  at::parallel_for(0, static_cast<int64_t>(prefix.size()), 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = out + r * n;
      for (int64_t j = 0; j < n; ++j) {
        row[j] = (key_mix(prefix[r], static_cast<uint64_t>(last[j])) >> 11) >= threshold ? 1.0f : 0.0f;
      }
    }
  });
  if (like.scalar_type() != at::kFloat) keep = keep.to(like.scalar_type());
  return like.is_cpu() ? keep : keep.to(like.device());
}

at::Tensor keyed_dropout(const at::Tensor& x, double p, uint64_t key, const std::vector<Coords>& dims) {
  if (p <= 0) return x;
  if (static_cast<int64_t>(dims.size()) != x.dim()) {
    throw std::invalid_argument(fmt::format("keyed_dropout: {} coordinate lists for a {}-dim tensor", dims.size(),
                                            x.dim()));
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (static_cast<int64_t>(dims[d].size()) != x.size(static_cast<int64_t>(d))) {
      throw std::invalid_argument(fmt::format("keyed_dropout: dim {} has {} coordinates for size {}", d,
                                              dims[d].size(), x.size(static_cast<int64_t>(d))));
    }
  }
  return x * keyed_keep(key, p, dims, x) * (1.0 / (1.0 - p));
}

}  // namespace meshtrain::nn
