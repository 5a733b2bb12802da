#include "meshtrain/ckpt/peft.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/hf.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/plan/spec_json.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

void export_peft(const std::string& step_dir, const std::string& out_dir, bool force) {
  if (fs::exists(out_dir) && !force) throw std::runtime_error(fmt::format("{} exists; pass --force to replace it", out_dir));
  Reader reader(step_dir);
  const auto& man = reader.manifest();
  if (!man.contains("lora") || !man["lora"].is_object()) {
    throw std::runtime_error(fmt::format("{} is not a LoRA checkpoint (no \"lora\" settings): peft holds adapters only",
                                         step_dir));
  }
  const plan::ModelSpec m = spec_from_json(man.at("config").at("model"));
  if (const HfFamily family = hf_family(m); family == HfFamily::Gpt2) {
    throw std::runtime_error(fmt::format("{}: peft adapts GPT-2's fused attention projection (c_attn) as one linear, "
                                         "meshtrain adapts q, k and v apart; --format peft exports Llama-family models "
                                         "(export the merged model with --format hf)",
                                         step_dir));
  } else if (family == HfFamily::Mixtral) {
    throw std::runtime_error(fmt::format("{}: --format peft exports dense Llama models; a Mixtral's adapters are not "
                                         "checked against peft yet (export the merged model with --format hf)",
                                         step_dir));
  }
  static const std::regex name(R"(layers\.(\d+)\.(attn|mlp)\.(\w+)\.lora_([ab]))");
  std::vector<NamedTensor> tensors;
  std::set<std::string> targets;
  for (auto& [ours, t] : model_weights(reader, /*adapters_only=*/true)) {
    std::smatch g;
    if (!std::regex_match(ours, g, name)) throw std::runtime_error(fmt::format("{}: adapter {} has no peft name", step_dir, ours));
    const std::string module = g[3].str() + "_proj";
    targets.insert(module);
    tensors.push_back({fmt::format("base_model.model.model.layers.{}.{}.{}.lora_{}.weight", g[1].str(),
                                   g[2].str() == "attn" ? "self_attn" : "mlp", module, g[4].str() == "a" ? "A" : "B"),
                       t.contiguous()});
  }
  const auto& lora = man["lora"];
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"task_type", "CAUSAL_LM"},
                                 {"r", lora.at("rank")},
                                 {"lora_alpha", lora.at("alpha")},
                                 {"lora_dropout", lora.value("dropout", 0.0)},
                                 {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
                                 {"bias", "none"},
                                 {"fan_in_fan_out", false},
                                 {"use_rslora", false},
                                 {"inference_mode", true},
                                 {"base_model_name_or_path", nullptr}};
  const std::string tmp = out_dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_safetensors((fs::path(tmp) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  std::ofstream(fs::path(tmp) / "adapter_config.json") << config.dump(2) << "\n";
  fs::remove_all(out_dir);
  fs::rename(tmp, out_dir);
}

}  // namespace meshtrain::ckpt
