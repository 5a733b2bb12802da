#include "comm/local_reduce.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstring>

namespace meshtrain {
namespace {

// acc[i] (= or +=) the sum of up to four rows at i: four input streams in one
// loop, which the hardware prefetchers follow better than one row at a time.
template <bool kAdd>
void add_group(float* __restrict acc, const float* const* r, int k, int64_t lo, int64_t len) {
  const float* a = r[0] + lo;
  const float* b = r[k > 1 ? 1 : 0] + lo;
  const float* c = r[k > 2 ? 2 : 0] + lo;
  const float* d = r[k > 3 ? 3 : 0] + lo;
  auto put = [&](int64_t i, float v) { acc[i] = kAdd ? acc[i] + v : v; };
  switch (k) {
    case 1: for (int64_t i = 0; i < len; ++i) put(i, a[i]); break;
    case 2: for (int64_t i = 0; i < len; ++i) put(i, a[i] + b[i]); break;
    case 3: for (int64_t i = 0; i < len; ++i) put(i, a[i] + b[i] + c[i]); break;
    default: for (int64_t i = 0; i < len; ++i) put(i, a[i] + b[i] + c[i] + d[i]); break;
  }
}

}  // namespace

bool is_16bit(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }

void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  if (op == ReduceOp::Max) at::maximum_out(acc, acc, x.to(acc.scalar_type()));
  else acc.add_(x);
}

void reduce_rows(const at::Tensor& out, const std::vector<at::Tensor>& rows, ReduceOp op) {
  const int n = static_cast<int>(rows.size());
  at::Tensor o = out.view(-1);
  if (o.scalar_type() == at::kFloat && op != ReduceOp::Max) {
    std::vector<const float*> p(n);
    for (int k = 0; k < n; ++k) p[k] = rows[k].data_ptr<float>();
    sum_rows(o.data_ptr<float>(), p.data(), n, o.numel());
  } else {
    at::Tensor acc = is_16bit(o) ? rows[0].to(at::kFloat) : rows[0].clone();
    for (int k = 1; k < n; ++k) combine(acc, rows[k], op);
    o.copy_(acc);
  }
  if (op == ReduceOp::Avg) o.div_(n);
}

void sum_rows(float* out, const float* const* rows, int n, int64_t m) {
  // Each block is summed in a local buffer, then stored: memory sees every
  // input once and `out` once, and `out` may alias any row.
  constexpr int64_t kBlock = 4096;
  alignas(64) float acc[kBlock];
  for (int64_t lo = 0; lo < m; lo += kBlock) {
    const int64_t len = std::min(kBlock, m - lo);
    add_group<false>(acc, rows, std::min(n, 4), lo, len);
    for (int r = 4; r < n; r += 4) add_group<true>(acc, rows + r, std::min(n - r, 4), lo, len);
    std::memcpy(out + lo, acc, len * sizeof(float));
  }
}

}  // namespace meshtrain
