// A callback after each accumulation of a parameter's gradient (a post-hook
// on its AccumulateGrad node): the gradient is final for this backward. Used
// by DDP and ZeRO to start reductions while backward goes on.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/nn/params.h"

namespace torch::autograd {
struct Node;
}

namespace meshtrain {

// Installs `ready` on `param`'s gradient accumulator and returns the
// accumulator, which the caller must keep alive (the tensor holds it weakly).
// Throws std::invalid_argument "<name> does not require grad" when it does not.
std::shared_ptr<torch::autograd::Node> on_grad_ready(const at::Tensor& param, const std::string& name,
                                                     std::function<void()> ready);

// After a synchronised backward: the names of parameters not `ready` (no
// gradient), or, with `find_unused`, none: each is marked ready and handed
// to `count_as_zero` instead.
std::vector<std::string> sweep_unused(const std::vector<Param>& params, std::vector<bool>& ready, bool find_unused,
                                      const std::function<void(size_t)>& count_as_zero);

// The error for parameters that got no gradient ("ddp", "zero"), naming up to three.
[[noreturn]] void throw_unused(const std::string& who, std::vector<std::string> names);

}  // namespace meshtrain
