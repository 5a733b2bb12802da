#include "meshtrain/train/precision.h"
#include "meshtrain/platform/device.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain {

Precision parse_train_precision(const std::string& s) {
  if (s == "fp32") return Precision::Fp32;
  if (s == "bf16") return Precision::Bf16;
  if (s == "fp16") return Precision::Fp16;
  if (s == "fp8") return Precision::Fp8;
  throw std::invalid_argument(fmt::format("precision '{}' unknown; use fp32, bf16, fp16 or fp8", s));
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
    case Precision::Fp8: return "fp8";
  }
  return "?";
}

c10::ScalarType compute_dtype(Precision p) {
  switch (p) {
    case Precision::Bf16:
    case Precision::Fp8: return c10::ScalarType::BFloat16;
    case Precision::Fp16: return c10::ScalarType::Half;
    default: return c10::ScalarType::Float;
  }
}

// Autocast on the device the run computes on (compat.h's device-type switches); the
// other device type's switch is left alone, so host-side bookkeeping stays in its dtype.
AutocastGuard::AutocastGuard(Precision p) : AutocastGuard(p, compute_device().type()) {}

AutocastGuard::AutocastGuard(Precision p, c10::DeviceType device) : device_(device) {
  if (p == Precision::Fp32) return;
  active_ = true;
  was_ = autocast_switch(device);
  set_autocast_switch(device, {true, compute_dtype(p)});
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_switch(device_, was_);
}

}  // namespace meshtrain
