// Internal: Σ x² of a tensor, accumulated in double, in one read pass and
// without temporaries (the gradient norm's; optim/adamw.h).
//
// t.to(kDouble).pow(2).sum() makes two double copies of the tensor (for GPT-2
// 124M's embedding gradient, 600 MB at the step's memory peak) and three
// passes. Here fp32 contiguous tensors are read once in blocks of 2^16
// elements, each block summed in double (8 lanes, then the lanes in order),
// the block sums added in block order: the same result whatever the thread
// count. Other dtypes and layouts take the ATen expression.
#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain {

double sum_of_squares(const at::Tensor& t);

}  // namespace meshtrain
