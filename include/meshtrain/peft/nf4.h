// NF4: the 4-bit NormalFloat data type of QLoRA (Dettmers et al., arXiv
// 2305.14314, §3), with double quantisation of the block scales.
//
// A weight tensor is flattened and cut into blocks of `block` (64) values;
// each block keeps its absmax c_b, and each value the index of the nearest of
// the 16 NF4 codes to w / c_b (kNf4Code below: bitsandbytes' table, quantiles
// of N(0, 1) scaled to [-1, 1], with an exact 0). Dequantised: code[idx] · c_b.
// Nearest-code rounding bounds the error per block by c_b · (largest gap
// between neighbouring codes) / 2 = 0.152 c_b.
//
// Double quantisation (§3, "Double Quantization"): the fp32 block scales are
// themselves quantised: offset = mean(c), and c − offset in blocks of 256 as
// int8 with one fp32 scale per 256 blocks (bitsandbytes uses an 8-bit dynamic
// map there; a linear int8 map costs the same bits). Storage per parameter:
// 4 + 8/64 + 32/(64·256) = 4.127 bits, against 4 + 32/64 = 4.5 without.
//
// Two codes per byte, the first in the high nibble (bitsandbytes' order).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain {

extern const std::array<float, 16> kNf4Code;

struct Nf4Tensor {
  std::vector<int64_t> shape;
  int64_t numel = 0, block = 64;
  at::Tensor packed;  // uint8 [ceil(blocks · block / 2)]
  // Block scales: fp32 `absmax` [blocks], or, double-quantised, int8 `qabsmax`
  // [blocks] with fp32 `scale2` [ceil(blocks / 256)] and `offset`.
  at::Tensor absmax, qabsmax, scale2;
  float offset = 0;
  bool double_quant() const { return qabsmax.defined(); }
  int64_t blocks() const { return (numel + block - 1) / block; }
  // Bytes held (packed codes and block scales).
  int64_t bytes() const;
};

// Quantises `w` (any float dtype); throws std::invalid_argument for a block
// that is not even and positive.
Nf4Tensor nf4_quantize(const at::Tensor& w, int64_t block = 64, bool double_quant = true);
// The block scales as dequantisation uses them (fp32 [blocks]).
at::Tensor nf4_scales(const Nf4Tensor& q);
// code[idx] · scale, in `shape`, as `dtype`.
at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype);
// The 4-bit indices, unpacked (uint8 [numel]), for tests.
at::Tensor nf4_indices(const Nf4Tensor& q);

}  // namespace meshtrain
