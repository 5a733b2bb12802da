// train.method = "dpo": the method, its [dpo] keys and its checks.
#include "meshtrain/dpo/method.h"

#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "meshtrain/dpo/dpo.h"
#include "meshtrain/dpo/settings.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/config_keys.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/method.h"

namespace meshtrain {
namespace {

#define DPO(member) [](auto& c) -> auto& { return settings<DpoSettings>(c).member; }

std::vector<ConfigKey> dpo_config_keys() {
  using namespace config_key;
  return {
      number("dpo.beta", DPO(beta), 0, true, kInf, false, "DPO's inverse temperature"),
      text("dpo.loss", DPO(loss), "sigmoid | ipo | hinge", "DPO loss"),
      text("dpo.reference", DPO(reference), "auto | copy | adapters", "the reference model"),
  };
}

#undef DPO

void check_dpo(const TrainConfig& c, const std::string& path) {
  // A pair's loss needs each sequence's whole log-probability on one rank.
  if (c.pp > 1 || c.cp > 1) {
    throw std::invalid_argument(fmt::format("{}: train.method = \"dpo\" needs each sequence whole on one rank: "
                                            "parallel.pp and cp must be 1 (they are {}, {}); tp, dp and ZeRO work",
                                            path, c.pp, c.cp));
  }
  const DpoSettings& s = dpo_settings(c);
  try {
    parse_dpo_loss(s.loss);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: dpo.loss: {}", path, e.what()));
  }
  const std::string reference = dpo_reference(c);
  if (reference != "copy" && reference != "adapters") {
    throw std::invalid_argument(
        fmt::format("{}: dpo.reference = \"{}\": use \"copy\", \"adapters\" or \"auto\"", path, s.reference));
  }
  if (reference == "adapters" && c.lora.rank == 0) {
    throw std::invalid_argument(fmt::format("{}: dpo.reference = \"adapters\" is the policy with its LoRA adapters "
                                            "off; set lora.rank or use dpo.reference = \"copy\"",
                                            path));
  }
}

Method dpo() {
  Method m;
  m.name = "dpo";
  m.summary = "direct preference optimisation on chosen/rejected pairs (tokenize prefs)";
  m.sections = {DpoSettings::kSection};
  m.pairs = true;
  m.packed_info = "dpo.json", m.tokenize = "prefs";
  m.check = check_dpo;
  m.copy_reference = [](const TrainConfig& c, EngineRole role) {
    return role == EngineRole::Method && dpo_reference(c) == "copy";
  };
  m.objective = [](const TrainConfig& c, EngineRole, Transformer* reference) -> std::unique_ptr<Objective> {
    const DpoSettings& s = dpo_settings(c);
    return std::make_unique<DpoObjective>(DpoOptions{s.beta, parse_dpo_loss(s.loss)}, reference);
  };
  return m;
}

}  // namespace

void register_dpo_method() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_config_keys(dpo_config_keys());
    register_method(dpo());
  });
}

}  // namespace meshtrain
