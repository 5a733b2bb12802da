// Bottleneck adapters (Houlsby et al., "Parameter-Efficient Transfer Learning
// for NLP", arXiv 1902.00751 sec. 2.1): after the attention and after the MLP
// of every block, before the residual addition,
//   a <- a + up(gelu(down(a))),   down [r, h] + bias, up [h, r] + bias,
// with up = 0 at the start, so training starts from exactly the base model.
// Every other parameter is frozen (as with LoRA, peft/lora.h).
//
// Under tensor parallelism the adapters act on whole hidden states (the row
// region's output), so their parameters are replicated; with sequence
// parallelism each rank holds a slice of the sequence, and their gradients are
// partial over tp (Param::sequence_partial, summed by finalize_grads).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "meshtrain/model/output_adapter.h"

namespace meshtrain {

class Transformer;

struct BottleneckAdapter final : OutputAdapter {
  at::Tensor down_w, down_b, up_w, up_b;
  at::Tensor forward(const at::Tensor& a) const override;  // a + up(gelu(down(a)))
};

struct AdapterOptions {
  int64_t bottleneck = 16;
  double init_std = 1e-3;  // of `down`: near identity at the start (Houlsby sec. 2.1)
};

// Adds two adapters to every block of `m` and freezes the rest; returns how
// many were added. Throws std::invalid_argument for a bottleneck < 1.
int64_t apply_adapters(Transformer& m, const AdapterOptions& o);

}  // namespace meshtrain
