// The planner's models from outside the presets: a Hugging Face config.json
// (plan/hf_config.h) and the shape flags of `meshtrain plan`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "meshtrain/plan/count.h"
#include "meshtrain/plan/hf_config.h"
#include "meshtrain/plan/typical.h"

namespace meshtrain::plan {
namespace {

// meta-llama/Llama-2-7b-hf config.json (the fields the planner reads).
nlohmann::json llama2_7b() {
  return {{"model_type", "llama"},        {"vocab_size", 32000},      {"hidden_size", 4096},
          {"intermediate_size", 11008},   {"num_hidden_layers", 32},  {"num_attention_heads", 32},
          {"num_key_value_heads", 32},    {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
}

// mistralai/Mixtral-8x7B-v0.1 config.json.
nlohmann::json mixtral_8x7b() {
  return {{"model_type", "mixtral"},   {"vocab_size", 32000},          {"hidden_size", 4096},
          {"intermediate_size", 14336}, {"num_hidden_layers", 32},     {"num_attention_heads", 32},
          {"num_key_value_heads", 8},  {"max_position_embeddings", 32768}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 1e6},         {"num_local_experts", 8},       {"num_experts_per_tok", 2},
          {"tie_word_embeddings", false}};
}

TEST(PlanModels, HuggingFaceConfigsGiveTheirPublishedParameterCounts) {
  const ModelSpec llama = model_from_hf_config(llama2_7b(), "Llama-2-7b-hf");
  EXPECT_EQ(count_params(llama).total, 6738415616);  // the model card's 6.74B, to the parameter
  EXPECT_EQ(count_params(llama).total, count_params(preset("llama2-7b")).total);
  const ModelSpec mixtral = model_from_hf_config(mixtral_8x7b(), "Mixtral-8x7B");
  EXPECT_EQ(mixtral.experts, 8);
  EXPECT_EQ(mixtral.top_k, 2);
  EXPECT_EQ(mixtral.kv_heads, 8);
  // 46.7B in all (HF's num_parameters: 46,702,792,704), 12.9B active per token.
  EXPECT_EQ(count_params(mixtral).total, 46702792704);
  EXPECT_NEAR(static_cast<double>(count_params(mixtral).active), 12.9e9, 0.05e9);
}

TEST(PlanModels, ConfigFileIsReadByPathOrDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "meshtrain_plan_models_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << llama2_7b().dump();
  EXPECT_EQ(count_params(model_from_hf_config_file(dir.string())).total, 6738415616);
  EXPECT_EQ(count_params(model_from_hf_config_file((dir / "config.json").string())).total, 6738415616);
  std::ofstream(dir / "bad.json") << "{ not json";
  try {
    model_from_hf_config_file((dir / "bad.json").string());
    ADD_FAILURE() << "bad JSON accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(PlanModels, UnplannableConfigsAreRefusedByName) {
  auto error = [](const nlohmann::json& j) {
    try {
      model_from_hf_config(j, "x");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json j = llama2_7b();
  j.erase("hidden_size");
  EXPECT_NE(error(j).find("\"hidden_size\""), std::string::npos) << error(j);
  j = llama2_7b();
  j["head_dim"] = 256;
  EXPECT_NE(error(j).find("head_dim 256"), std::string::npos) << error(j);
  j = llama2_7b();
  j["model_type"] = "deepseek_v3";
  EXPECT_NE(error(j).find("latent attention"), std::string::npos) << error(j);
  j["model_type"] = "t5";
  EXPECT_NE(error(j).find("\"t5\""), std::string::npos) << error(j);
  // Found by the fuzzer (issue #43): a field of another type or out of range is named, not a raw
  // JSON exception or an overflow.
  j = llama2_7b();
  j["model_type"] = 7;
  EXPECT_NE(error(j).find("\"model_type\" is 7, not a string"), std::string::npos) << error(j);
  j = llama2_7b();
  j["hidden_size"] = INT64_MIN;
  EXPECT_NE(error(j).find("\"hidden_size\" = -9223372036854775808 is outside 1..2147483647"), std::string::npos)
      << error(j);
  j = llama2_7b();
  j["rms_norm_eps"] = "small";
  EXPECT_NE(error(j).find("\"rms_norm_eps\" is \"small\", not a number"), std::string::npos) << error(j);
  j = llama2_7b();
  j["num_hidden_layers"] = 1000000;
  EXPECT_NE(error(j).find("layers = 1000000 is more than 100000"), std::string::npos) << error(j);
}

TEST(PlanModels, ShapeFlagsReplaceTheBaseFields) {
  const ModelSpec base = preset("llama2-7b");
  ShapeFlags f;
  f.layers = 16;
  const ModelSpec half = apply_shape_flags(base, f);
  const ParamCount a = count_params(base), b = count_params(half);
  EXPECT_EQ(a.total - b.total, 16 * a.layer.total());
  f.heads = 16;  // kv heads follow an MHA model's heads unless given
  EXPECT_EQ(apply_shape_flags(base, f).kv_heads, 16);
  f.kv_heads = 4;
  EXPECT_EQ(apply_shape_flags(base, f).kv_heads, 4);
  ShapeFlags moe;
  moe.experts = 8;
  EXPECT_THROW(apply_shape_flags(base, moe), std::invalid_argument);  // no top_k
  moe.top_k = 2;
  EXPECT_EQ(count_params(apply_shape_flags(base, moe)).moe_layers, 32);
  ShapeFlags bad;
  bad.heads = 30;  // 4096 is not divisible by 30
  EXPECT_THROW(apply_shape_flags(base, bad), std::invalid_argument);
}

TEST(PlanModels, AModelFromFlagsNamesWhatIsMissing) {
  ShapeFlags f;
  f.layers = 32, f.hidden = 4096, f.heads = 32, f.ffn = 11008;
  try {
    model_from_flags("llama", f, 0);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab --seq"), std::string::npos) << e.what();
  }
  f.vocab = 32000;
  // Llama 2 7B from flags: the same count as its preset.
  EXPECT_EQ(count_params(model_from_flags("llama", f, 4096)).total, 6738415616);
  EXPECT_THROW(model_from_flags("bert", f, 4096), std::invalid_argument);
}

TEST(PlanModels, TypicalRunsAreEachPlanned) {
  const std::vector<TypicalRun> runs = typical_runs();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[2].input.gpus, 1024);
  const std::string report = typical_report();
  for (const TypicalRun& t : runs) {
    const SearchResult r = search(t.input);
    ASSERT_FALSE(r.ranked.empty()) << t.title;
    const Candidate& best = r.ranked.front();
    EXPECT_LE(best.peak_bytes, t.input.gpu.memory_bytes) << t.title;
    EXPECT_EQ(best.strategy.world(), t.input.gpus);
    // The report carries the plan, its step time and its ledger's total.
    EXPECT_NE(report.find("Plan: " + best.strategy.describe()), std::string::npos) << t.title;
    EXPECT_NE(report.find(fmt::format("= {:.3f} s;", best.estimate.step_s)), std::string::npos) << t.title;
    EXPECT_NE(report.find(human_bytes(best.peak_bytes)), std::string::npos) << t.title;
  }
}

}  // namespace
}  // namespace meshtrain::plan
