#include "optim/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace meshtrain {
namespace {

// The per-element loop, compiled for AVX-512, AVX2 and the baseline, the best
// picked at load time (GCC's function multiversioning): ATen's own kernels are
// vectorised the same way, and a scalar loop loses to them despite its single pass.
__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_range(
    float* __restrict pw, const float* __restrict pg, float* __restrict pm, float* __restrict pv, int64_t begin,
    int64_t end, float clip, float b1, float a1, float b2, float a2, float bc2, float eps, float keep, float step) {
  for (int64_t i = begin; i < end; ++i) {
    const float gi = pg[i] * clip;
    const float mi = pm[i] * b1 + a1 * gi;
    const float vi = pv[i] * b2 + a2 * gi * gi;
    pm[i] = mi;
    pv[i] = vi;
    const float denom = __builtin_sqrtf(vi / bc2) + eps;
    pw[i] = pw[i] * keep - step * (mi / denom);
  }
}

}  // namespace

bool fused_adamw_update(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                        const AdamWCoefficients& c) {
  for (const at::Tensor* t : {&p, &g, &m, &v}) {
    if (t->scalar_type() != at::kFloat || !t->is_contiguous() || !t->is_cpu() || t->numel() != p.numel()) return false;
  }
  float* pw = p.data_ptr<float>();
  const float* pg = g.data_ptr<float>();
  float* pm = m.data_ptr<float>();
  float* pv = v.data_ptr<float>();
  const float b1 = c.beta1, a1 = c.one_minus_beta1, b2 = c.beta2, a2 = c.one_minus_beta2;
  // 16K elements per task: below that, handing work to another thread costs more than the loop.
  at::parallel_for(0, p.numel(), 16384, [&](int64_t begin, int64_t end) {
    adamw_range(pw, pg, pm, pv, begin, end, c.clip, b1, a1, b2, a2, c.bc2, c.eps, c.keep, c.step);
  });
  return true;
}

}  // namespace meshtrain
