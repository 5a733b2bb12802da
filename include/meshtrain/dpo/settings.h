// The [dpo] section (train.method = "dpo", dpo/dpo.h): its own struct, kept in
// TrainConfig::method_settings (train/config.h's settings<T>), its keys declared
// and registered with the method (dpo/method.h).
#pragma once

#include <string>

#include "meshtrain/train/config.h"

namespace meshtrain {

// beta: the implicit reward's inverse temperature; loss: sigmoid | ipo | hinge;
// reference: "copy" (a frozen copy of the starting weights), "adapters" (the
// policy with its LoRA adapters off: no second copy; needs LoRA) or "auto"
// (adapters with LoRA, else copy: dpo_reference below).
struct DpoSettings {
  static constexpr const char* kSection = "dpo";
  double beta = 0.1;
  std::string loss = "sigmoid";
  std::string reference = "auto";
};

inline const DpoSettings& dpo_settings(const TrainConfig& c) { return settings<DpoSettings>(c); }

// The reference the run uses: dpo.reference with "auto" resolved by lora.rank.
inline std::string dpo_reference(const TrainConfig& c) {
  const std::string& r = dpo_settings(c).reference;
  if (r != "auto") return r;
  return c.lora.rank > 0 ? "adapters" : "copy";
}

}  // namespace meshtrain
