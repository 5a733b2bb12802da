// Internal: the local half of a reduction, once the data of every rank is at
// hand (a reduce-scatter's received chunks, the segments of a shared-memory
// group, a ring step's partial sum).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/comm/comm.h"

namespace meshtrain {

bool is_16bit(const at::Tensor& t);

// acc <- acc (op) x. Both may differ in dtype (16-bit x into an fp32 acc).
void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op);

// out[i] = rows[0][i] + rows[1][i] + ... + rows[n-1][i] for i < m, added in
// row order. One pass: each input element is read once and each output
// written once, where n-1 separate adds would read 2(n-1)m and write (n-1)m
// elements. `out` may be one of the rows.
void sum_rows(float* out, const float* const* rows, int n, int64_t m);

// Reduces `rows` (n tensors of m elements, of out's dtype) into `out`, in row
// order, accumulating 16-bit types in fp32 and rounding once. fp32 sums take
// sum_rows; the rest sequential adds (a sum over dim 0 was measured 2-4x
// slower here). `out` may be one of the rows.
void reduce_rows(const at::Tensor& out, const std::vector<at::Tensor>& rows, ReduceOp op);

}  // namespace meshtrain
