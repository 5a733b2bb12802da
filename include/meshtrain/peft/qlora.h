// QLoRA (Dettmers et al., arXiv 2305.14314): LoRA (peft/lora.h) on a base
// whose block linears are stored in NF4 (peft/nf4.h) instead of fp32.
//
// quantize_base replaces every block linear's weight (this rank's tp shard)
// by its NF4 form and drops the fp32 tensor: the linear dequantises it on the
// fly, in forward and again in backward (nf4_linear below saves the 4-bit
// codes, not a dequantised copy, for the input gradient; the frozen weight
// gets no gradient). The weights leave the model's parameter store, so
// optimizers, gradient reduction and checkpoints never see them: a QLoRA
// checkpoint holds the rest of the model and the adapters, and its base
// linears are the [init] weights, quantised again (deterministic) on resume.
// Embeddings, norms and the head stay as they are (as in the paper).
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "meshtrain/parallel/tensor/linear_addons.h"
#include "meshtrain/peft/nf4.h"

namespace meshtrain {

class Transformer;

struct QloraOptions {
  int64_t block = 64;
  bool double_quant = true;
};

// x [.., in] · dequant(w)ᵀ: [.., out]; differentiable in x only.
at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& w);

// A block linear's weight in NF4, as the layer holds it (parallel/tensor/layers.h).
struct Nf4Weight final : PackedWeight {
  explicit Nf4Weight(Nf4Tensor t) : tensor(std::move(t)) {}
  at::Tensor linear(const at::Tensor& x) const override { return nf4_linear(x, tensor); }
  Nf4Tensor tensor;
};

// Quantises every block linear of `m`; returns the bytes the NF4 weights hold.
// Throws std::invalid_argument when the model has no LoRA adapters (its base
// would be frozen with nothing to train) or is already quantised.
int64_t quantize_base(Transformer& m, const QloraOptions& o);
// The bytes of `m`'s NF4 weights (0 when not quantised).
int64_t quantized_bytes(Transformer& m);

}  // namespace meshtrain
