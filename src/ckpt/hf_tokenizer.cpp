#include "meshtrain/ckpt/hf_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "meshtrain/platform/subprocess.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

HfTokenizer describe_tokenizer(const std::string& model_path) {
  if (!fs::is_regular_file(model_path)) {
    throw std::invalid_argument(fmt::format("tokenizer {} does not exist", model_path));
  }
  HfTokenizer t;
  t.model = model_path;
  std::istringstream lines(capture_output({helper_path("meshtrain-tokenize"), "special", "--tokenizer", model_path}));
  std::string name;
  while (lines >> name) {
    if (name == "vocab") {
      lines >> t.vocab;
      continue;
    }
    HfTokenizer::Special s;
    lines >> s.id;
    if (s.id >= 0) lines >> s.piece;
    if (name == "unk") t.unk = s;
    else if (name == "bos") t.bos = s;
    else if (name == "eos") t.eos = s;
  }
  if (t.vocab <= 0 || !lines.eof()) {
    throw std::runtime_error(fmt::format("tokenizer {}: meshtrain-tokenize special gave no vocabulary", model_path));
  }
  return t;
}

std::string tokenizer_beside_data(const nlohmann::json& manifest) {
  const nlohmann::json data = manifest.value("config", nlohmann::json::object()).value("train", nlohmann::json::object())
                                  .value("data", nlohmann::json::array());
  if (!data.is_array() || data.empty() || !data[0].is_string()) return "";
  const fs::path beside = fs::path(data[0].get<std::string>()).parent_path() / "tokenizer.model";
  return fs::is_regular_file(beside) ? beside.string() : "";
}

void check_hf_tokenizer(const HfTokenizer& t, int64_t model_vocab) {
  if (t.vocab > model_vocab) {
    throw std::invalid_argument(fmt::format("tokenizer {} has {} pieces, more than the model's vocabulary of {}: "
                                            "give the tokenizer the run was trained with (--tokenizer)",
                                            t.model, t.vocab, model_vocab));
  }
}

void write_hf_tokenizer(const HfTokenizer& t, int64_t model_vocab, int64_t max_length, const std::string& dir,
                        nlohmann::json& config) {
  check_hf_tokenizer(t, model_vocab);
  fs::copy_file(t.model, fs::path(dir) / "tokenizer.model", fs::copy_options::overwrite_existing);
  auto id = [](const HfTokenizer::Special& s) { return s.id >= 0 ? nlohmann::json(s.id) : nlohmann::json(); };
  auto piece = [](const HfTokenizer::Special& s) { return s.id >= 0 ? nlohmann::json(s.piece) : nlohmann::json(); };
  const nlohmann::json specials = {{"unk_token", piece(t.unk)}, {"bos_token", piece(t.bos)}, {"eos_token", piece(t.eos)}};
  nlohmann::json tc = specials;
  tc["tokenizer_class"] = "PreTrainedTokenizerFast";
  tc["add_bos_token"] = false;
  tc["add_eos_token"] = false;
  tc["clean_up_tokenization_spaces"] = false;
  tc["model_max_length"] = max_length;
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << tc.dump(2) << "\n";
  std::ofstream(fs::path(dir) / "special_tokens_map.json") << specials.dump(2) << "\n";
  config["bos_token_id"] = id(t.bos);
  config["eos_token_id"] = id(t.eos);
  const nlohmann::json gen = {{"bos_token_id", id(t.bos)}, {"eos_token_id", id(t.eos)}};
  std::ofstream(fs::path(dir) / "generation_config.json") << gen.dump(2) << "\n";
}

}  // namespace meshtrain::ckpt
