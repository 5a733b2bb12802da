// Mixed precision: which dtype computes, which one keeps the weights.
//
//   mode   compute  weights (master)  gradients  Adam m, v   bytes/param (persistent)
//   fp32   fp32     fp32              fp32       fp32        4 + 4 + 8 = 16
//   bf16   bf16     fp32              fp32       fp32        4 + 4 + 8 = 16, plus a transient
//                                                            bf16 copy of each weight while
//                                                            its layer computes (2)
//   fp16   fp16     fp32              fp32       fp32        as bf16, plus a loss scaler (GPU only)
//   fp8    bf16,    fp32              fp32       fp32        as bf16; each block linear also keeps
//          blocks'                                           its input and weight in e4m3 (1 byte
//          linears                                           an element) for the backward, and its
//          FP8                                               scaling state (nn/fp8.h)
//
// bf16/fp16 cast at the operations (autocast, as torch.autocast): matmuls and
// linears run in the low precision; norms, softmax and the cross-entropy in
// fp32; the fp32 weights are the master copy and receive fp32 gradients,
// which are reduced across data-parallel ranks in fp32. (Megatron-LM keeps a
// persistent bf16 copy instead: 2 + 4 + 12 = 18 bytes/param; the ZeRO paper's
// 16 = 2 + 2 + 12 keeps bf16 gradients. plan/strategy.h has both.)
//
// fp8 (train/fp8_training.h) is bf16 with the transformer blocks' linears in FP8:
// the output layer and the routed experts stay bf16, as in torchtitan's float8 and
// Transformer Engine's recipes.
//
// fp16 needs a loss scaler because its range is narrow (optim/loss_scaler.h);
// libtorch has no fp16 matmul, layer_norm or softmax on CPU, so fp16 is a
// GPU-only mode (../shared/PLATFORM.md).
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "meshtrain/compat.h"

namespace meshtrain {

enum class Precision { Fp32, Bf16, Fp16, Fp8 };
// "fp32" | "bf16" | "fp16" | "fp8"; std::invalid_argument otherwise.
Precision parse_train_precision(const std::string& s);
const char* to_string(Precision p);
c10::ScalarType compute_dtype(Precision p);  // fp8: bf16 (what autocast casts to)

// Casts eligible operations on `device` to compute_dtype(p) while alive (nothing for
// fp32), then restores the previous state and drops autocast's cache of cast weights.
class AutocastGuard {
 public:
  // On the device this process computes on (platform/device.h).
  explicit AutocastGuard(Precision p);
  AutocastGuard(Precision p, c10::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false;
  AutocastSwitch was_;
};

}  // namespace meshtrain
