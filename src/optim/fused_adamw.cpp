#include "optim/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace meshtrain {

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
    for (int64_t i = begin; i < end; ++i) {
      const float gi = pg[i] * c.clip;
      const float mi = pm[i] * b1 + a1 * gi;
      const float vi = pv[i] * b2 + a2 * gi * gi;
      pm[i] = mi;
      pv[i] = vi;
      const float denom = std::sqrt(vi / c.bc2) + c.eps;
      pw[i] = pw[i] * c.keep - c.step * (mi / denom);
    }
  });
  return true;
}

}  // namespace meshtrain
