#include "meshtrain/peft/nf4.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain {

// bitsandbytes functional.py, get_4bit_type("nf4") (QLoRA's Appendix E).
const std::array<float, 16> kNf4Code = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

namespace {

constexpr int64_t kScaleBlock = 256;  // block scales per second-level scale

at::Tensor code_table() { return at::tensor(std::vector<float>(kNf4Code.begin(), kNf4Code.end()), at::kFloat); }

}  // namespace

int64_t Nf4Tensor::bytes() const {
  int64_t b = packed.numel();
  if (double_quant()) {
    b += qabsmax.numel() + scale2.numel() * 4 + 4;
  } else {
    b += absmax.numel() * 4;
  }
  return b;
}

Nf4Tensor nf4_quantize(const at::Tensor& w, int64_t block, bool double_quant) {
  if (block < 2 || block % 2 != 0) throw std::invalid_argument(fmt::format("NF4 block {} must be even and positive", block));
  Nf4Tensor q;
  q.shape = w.sizes().vec();
  q.numel = w.numel();
  q.block = block;
  const int64_t blocks = q.blocks();
  at::Tensor flat = w.detach().reshape({-1}).to(at::kFloat);
  if (blocks * block != q.numel) flat = at::cat({flat, at::zeros({blocks * block - q.numel}, at::kFloat)});
  const at::Tensor x = flat.view({blocks, block});
  const at::Tensor absmax = x.abs().amax(1);
  // The nearest code: bucketize against the midpoints of the sorted table.
  const at::Tensor code = code_table();
  const at::Tensor mid = (code.narrow(0, 0, 15) + code.narrow(0, 1, 15)) / 2;
  const at::Tensor normed = x / at::where(absmax > 0, absmax, at::ones_like(absmax)).unsqueeze(1);
  const at::Tensor idx = at::bucketize(normed.reshape({-1}), mid).to(at::kByte);  // [blocks · block]
  const at::Tensor pairs = idx.view({-1, 2});
  q.packed = (pairs.select(1, 0) * 16 + pairs.select(1, 1)).to(at::kByte).contiguous();
  if (!double_quant) {
    q.absmax = absmax.contiguous();
    return q;
  }
  q.offset = absmax.mean().item<float>();
  const int64_t groups = (blocks + kScaleBlock - 1) / kScaleBlock;
  at::Tensor centred = absmax - q.offset;
  if (groups * kScaleBlock != blocks) centred = at::cat({centred, at::zeros({groups * kScaleBlock - blocks}, at::kFloat)});
  const at::Tensor g = centred.view({groups, kScaleBlock});
  q.scale2 = g.abs().amax(1).contiguous();
  const at::Tensor s = at::where(q.scale2 > 0, q.scale2, at::ones_like(q.scale2)).unsqueeze(1);
  q.qabsmax = at::round(g / s * 127).clamp(-127, 127).to(at::kChar).reshape({-1}).narrow(0, 0, blocks).contiguous();
  return q;
}

at::Tensor nf4_scales(const Nf4Tensor& q) {
  if (!q.double_quant()) return q.absmax;
  const at::Tensor per_block = q.scale2.repeat_interleave(kScaleBlock).narrow(0, 0, q.blocks());
  return q.qabsmax.to(at::kFloat) / 127 * per_block + q.offset;
}

// Every stored index, padding included: [blocks · block].
at::Tensor unpack(const Nf4Tensor& q) {
  return at::stack({at::floor_divide(q.packed, 16), at::remainder(q.packed, 16)}, 1).reshape({-1});
}

at::Tensor nf4_indices(const Nf4Tensor& q) { return unpack(q).narrow(0, 0, q.numel); }

at::Tensor nf4_dequantize(const Nf4Tensor& q, at::ScalarType dtype) {
  const at::Tensor values = code_table().index_select(0, unpack(q).to(at::kLong)).view({q.blocks(), q.block});
  const at::Tensor w = (values * nf4_scales(q).unsqueeze(1)).reshape({-1}).narrow(0, 0, q.numel);
  return w.view(q.shape).to(dtype);
}

}  // namespace meshtrain
