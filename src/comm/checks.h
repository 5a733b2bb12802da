// What comm.cpp and comm_p2p.cpp share: the tag range Comm keeps for itself, and the
// checks and views every call applies to its tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace meshtrain {

// Tags at and above this value are reserved for Comm's own ring algorithms.
constexpr int kRingTagBase = 1 << 20;

// Gloo cannot move bf16: reinterpret it as fp16 (same width, no arithmetic).
inline at::Tensor as_transport(const at::Tensor& t, bool native_bf16) {
  if (!native_bf16 && t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
  return t;
}

inline void check_contiguous(const char* op, const at::Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(fmt::format("{}: tensor is undefined", op));
  if (!t.is_contiguous()) {
    throw std::invalid_argument(
        fmt::format("{}: tensor of shape {} is not contiguous; call .contiguous() first", op, t.sizes()));
  }
}

}  // namespace meshtrain
