// Fuzz targets: the training config (a TOML file, and `--set` overrides on a
// valid one), a Hugging Face config.json as the planner reads it, and the
// flight records `meshtrain diagnose hang` reads. See fuzz.h.
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz.h"
#include "meshtrain/comm/hang_report.h"
#include "meshtrain/plan/hf_config.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/config_keys.h"

namespace fs = std::filesystem;

namespace {

// print_config's promise (train/config.h): its text loads back to the same
// config. An accepted config that does not round-trip is a bad accept.
void check_round_trip(const meshtrain::TrainConfig& c) {
  const std::string printed = meshtrain::print_config(c);
  const std::string again = meshtrain::print_config(
      meshtrain::load_train_config(fuzz::write_scratch("printed.toml", printed), {}));
  if (again != printed) throw fuzz::BadAccept("a config whose printed form loads back to another config");
}

void check_config(const std::string& text) {
  check_round_trip(meshtrain::load_train_config(fuzz::write_scratch("config.toml", text), {}));
}

// `--set` overrides, separated by the record separator 0x1e, on the demo's config.
void check_overrides(const std::string& text) {
  std::vector<std::string> sets;
  for (size_t b = 0;;) {
    const size_t e = text.find('\x1e', b);
    sets.push_back(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  static const std::string base = fuzz::read_file(std::string(MESHTRAIN_FUZZ_CORPUS) + "/train_config/valid-kjv-tiny.toml");
  check_round_trip(meshtrain::load_train_config(fuzz::write_scratch("base.toml", base), sets));
}

void check_hf_config(const std::string& text) {
  meshtrain::plan::model_from_hf_config_file(fuzz::write_scratch("config.json", text));
}

void check_flight_records(const std::string& text) {
  const fs::path dir = fs::path(fuzz::scratch()) / "flight";
  fs::create_directories(dir);
  fuzz::write_scratch("flight/rank_00001.json", text);
  std::vector<std::string> problems;
  const auto records = meshtrain::read_flight_records(dir.string(), &problems);
  for (int world : {1, 2, 8}) meshtrain::hang_report(records, world, {{0, "exited 1"}}, 2);
}

std::vector<std::string> config_words() {
  std::vector<std::string> words{"[model]", "[train]", "[data]", "[parallel]", "[lora]", "[rl]", "\n[", "]\n", " = ",
                                 "\"", "'''", "[[data.sources]]", "{ name = \"x\", path = [\"a.bin\"] }", "\\u0000"};
  for (const auto& k : meshtrain::config_keys()) {
    words.push_back(k.name);
    words.push_back(k.name.substr(k.name.find('.') + 1) + " = ");
  }
  return words;
}

}  // namespace

std::vector<fuzz::Target> config_targets() {
  std::vector<fuzz::Target> out(4);
  out[0].name = "train_config";
  out[0].dictionary = config_words();
  out[0].run = check_config;
  out[1].name = "config_set";
  out[1].dictionary = config_words();
  out[1].dictionary.push_back("\x1e");
  out[1].run = check_overrides;
  out[2].name = "hf_config";
  out[2].dictionary = {"\"model_type\"", "\"llama\"", "\"gpt2\"", "\"qwen2_moe\"", "\"num_key_value_heads\"",
                       "\"head_dim\"", "\"num_experts_per_tok\"", "\"rope_scaling\"", "\"tie_word_embeddings\""};
  out[2].mutate = fuzz::mutate_json;
  out[2].run = check_hf_config;
  out[3].name = "flight_records";
  out[3].dictionary = {"\"calls\"", "\"groups\"", "\"state\"", "\"started\"", "\"failed\"", "\"all_to_all\""};
  out[3].mutate = fuzz::mutate_json;
  out[3].run = check_flight_records;
  return out;
}
