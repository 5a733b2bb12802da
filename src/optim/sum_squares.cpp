#include "optim/sum_squares.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace meshtrain {
namespace {

constexpr int64_t kBlock = int64_t{1} << 16;
constexpr int kLanes = 8;

// Lane j sums elements j, j + 8, ...; then the lanes and the tail in a fixed order.
__attribute__((target_clones("avx512f", "avx2", "default"))) double block_sum_of_squares(const float* x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lane[j] += v * v;
    }
  }
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += lane[j];
  for (; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace

double sum_of_squares(const at::Tensor& t) {
  if (t.scalar_type() != at::kFloat || !t.is_contiguous() || !t.device().is_cpu()) {
    return t.to(at::kDouble).pow(2).sum().item<double>();
  }
  const float* x = t.data_ptr<float>();
  const int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      partial[static_cast<size_t>(b)] = block_sum_of_squares(x + b * kBlock, std::min(kBlock, n - b * kBlock));
    }
  });
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace meshtrain
