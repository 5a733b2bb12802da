// Dynamic loss scaling for fp16 (Micikevicius et al., arXiv 1710.03740 sec. 3.2;
// the policy of torch.cuda.amp.GradScaler and Megatron-LM):
//
//   backward on loss x S;  grads /= S before the step;
//   any inf/NaN in any gradient on any rank -> skip the step, S *= 0.5;
//   after `growth_interval` consecutive clean steps -> S *= 2.
//
// All ranks decide together (the check is all-reduced), so no rank steps
// while another skips. Scaling by powers of two is exact in binary floating
// point: without overflow, scaled training equals unscaled training bitwise.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/nn/params.h"

namespace meshtrain {

class Comm;

struct LossScalerState {
  double scale = 65536.0;  // 2^16
  int64_t good_steps = 0;  // clean steps since the last change
  int64_t skipped = 0;     // steps skipped so far
};

class LossScaler {
 public:
  explicit LossScaler(double initial_scale = 65536.0, int64_t growth_interval = 2000, double backoff = 0.5,
                      double growth = 2.0);
  double scale() const { return s_.scale; }

  // After backward (and the data-parallel reduction): whether every gradient
  // is finite on every rank of `groups`; when it is, divides them by the scale.
  bool unscale(std::vector<Param>& params, const std::vector<Comm*>& groups);
  // Records the outcome of a step: halves the scale after an overflow,
  // doubles it after growth_interval clean steps.
  void update(bool finite);

  const LossScalerState& state() const { return s_; }
  void restore(const LossScalerState& s) { s_ = s; }

 private:
  LossScalerState s_;
  int64_t growth_interval_;
  double backoff_, growth_;
};

}  // namespace meshtrain
