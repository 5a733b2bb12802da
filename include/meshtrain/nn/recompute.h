// Activation recomputation (Chen et al., arXiv 1604.06174; selective:
// Korthikanti et al., arXiv 2205.05198 sec. 5): run a function without keeping
// its intermediate activations, and run it again during backward.
//
//   none       keep everything
//   selective  recompute the attention core (scores, softmax, dropout mask,
//              probs x V): the s^2 activations that are cheap to recompute
//   full       keep only each block's input; recompute the block
//
// Invariant: gradients equal those without recomputation, bitwise. The re-run
// uses the same inputs, the same kernels (and mixed precision) and the same dropout masks: each
// generator's state is captured at the first run, restored for the re-run and
// put back afterwards, so the draws of the rest of the step are unchanged.
// Collectives inside the function (tensor parallelism) run again in backward,
// in the same order on every rank.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "meshtrain/plan/strategy.h"

namespace meshtrain::nn {

// The planner's enum (plan/strategy.h: parse_recompute, to_string), so a
// plan and a run speak of the same thing.
using Recompute = plan::Recompute;

using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(inputs) now without autograd history, and again under autograd during
// backward. Parameters used inside fn receive their gradients then. `rngs`:
// the generators fn draws from.
std::vector<at::Tensor> checkpoint(TensorFn fn, const std::vector<at::Tensor>& inputs,
                                   std::vector<at::Generator*> rngs = {});

}  // namespace meshtrain::nn
