#include "meshtrain/optim/loss_scaler.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/comm/comm.h"

namespace meshtrain {

LossScaler::LossScaler(double initial_scale, int64_t growth_interval, double backoff, double growth)
    : growth_interval_(growth_interval), backoff_(backoff), growth_(growth) {
  if (!(initial_scale > 0) || growth_interval < 1 || !(backoff > 0 && backoff < 1) || !(growth > 1)) {
    throw std::invalid_argument(fmt::format("loss scaler: scale {} > 0, growth interval {} >= 1, backoff {} in (0, 1), "
                                            "growth {} > 1 required",
                                            initial_scale, growth_interval, backoff, growth));
  }
  s_.scale = initial_scale;
}

bool LossScaler::unscale(std::vector<Param>& params, const std::vector<Comm*>& groups) {
  bool finite = true;
  for (const auto& p : params) {
    const at::Tensor& g = p.tensor.grad();
    if (g.defined() && !at::isfinite(g).all().item<bool>()) {
      finite = false;
      break;
    }
  }
  at::Tensor bad = at::full({1}, finite ? 0.0f : 1.0f);
  for (Comm* c : groups) {
    if (c && c->size() > 1) c->all_reduce(bad, ReduceOp::Max);
  }
  if (bad.item<float>() != 0.0f) return false;
  const double inv = 1.0 / s_.scale;
  for (auto& p : params) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(inv);
  }
  return true;
}

void LossScaler::update(bool finite) {
  if (!finite) {
    s_.scale *= backoff_;
    s_.good_steps = 0;
    s_.skipped += 1;
    return;
  }
  if (++s_.good_steps >= growth_interval_) {
    s_.scale *= growth_;
    s_.good_steps = 0;
  }
}

}  // namespace meshtrain
