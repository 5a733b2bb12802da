// Hugging Face interchange (ckpt/hf.h): export then import is the identity for
// the three families; the layouts are the table's (GPT-2's fused, transposed c_attn;
// Llama's [out, in] projections; Mixtral's one tensor per expert); config.json round-trips the shape; a missing
// or misshaped tensor is one error naming it; and through the CLI, a checkpoint
// exported to a Hugging Face directory and imported back starts training with
// the same first loss as the original ([init] from); config.json's rotary base
// is read in both transformers layouts and fields meshtrain does not model are
// refused by name (Mixtral's too, and the MoE shapes it does not hold).
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/hf.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

// The model's full tensors by name, vocabulary padding removed (what a checkpoint export holds).
std::map<std::string, at::Tensor> ours_of(Transformer& t) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : t.params().params()) {
    at::Tensor x = p.tensor.detach();
    if (p.name == "embed.weight" || p.name == "head.weight") x = x.narrow(0, 0, t.spec().vocab);
    out[p.name] = x.contiguous();
  }
  return out;
}

plan::ModelSpec small(const char* preset, bool tied) {
  plan::ModelSpec m = plan::preset(preset);
  m.layers = 2, m.vocab = 100, m.seq = 16, m.dropout = 0, m.tied = tied;
  return m;
}

TEST(HuggingFace, RoundTripIsTheIdentityAndLayoutsFollowTheTable) {
  for (const auto& [preset, tied] :
       {std::pair{"gpt-tiny", true}, {"llama-tiny", false}, {"llama-tiny", true}, {"moe-tiny", false}}) {
    const plan::ModelSpec m = small(preset, tied);
    Comm solo("solo", 0);
    Transformer t(m, solo, false, 9);
    const auto ours = ours_of(t);
    const auto hf = ckpt::to_hf(ours, m);
    const auto back = ckpt::from_hf(hf, m);
    ASSERT_EQ(back.size(), ours.size()) << preset;
    for (const auto& [name, x] : ours) EXPECT_TRUE(at::equal(back.at(name), x)) << preset << " " << name;
    EXPECT_EQ(ckpt::spec_from_hf_config(ckpt::hf_config(m)).hidden, m.hidden);
    const plan::ModelSpec again = ckpt::spec_from_hf_config(ckpt::hf_config(m));
    EXPECT_EQ(again.layers, m.layers);
    EXPECT_EQ(again.kv_heads, m.kv_heads);
    EXPECT_EQ(again.ffn, m.ffn);
    EXPECT_EQ(again.tied, m.tied);
    if (std::string(preset) == "gpt-tiny") {
      const int64_t h = m.hidden;
      EXPECT_EQ(hf.at("transformer.h.0.attn.c_attn.weight").sizes().vec(), (std::vector<int64_t>{h, 3 * h}));
      EXPECT_TRUE(at::equal(hf.at("transformer.h.0.attn.c_attn.weight").narrow(1, h, h),
                            ours.at("layers.0.attn.k.weight").t()));
      EXPECT_TRUE(at::equal(hf.at("transformer.h.1.mlp.c_fc.weight"), ours.at("layers.1.mlp.fc1.weight").t()));
      EXPECT_EQ(hf.count("lm_head.weight"), 0u);
    } else {
      EXPECT_TRUE(at::equal(hf.at("model.layers.1.self_attn.k_proj.weight"), ours.at("layers.1.attn.k.weight")));
      EXPECT_EQ(hf.count("lm_head.weight"), tied ? 0u : 1u);
    }
    if (std::string(preset) == "moe-tiny") {  // Mixtral: the Hub's one tensor per expert
      EXPECT_EQ(ckpt::hf_family(m), ckpt::HfFamily::Mixtral);
      EXPECT_EQ(ckpt::hf_config(m)["model_type"], "mixtral");
      EXPECT_EQ(again.experts, m.experts);
      EXPECT_EQ(again.top_k, m.top_k);
      EXPECT_EQ(again.expert_width(), m.expert_width());
      EXPECT_EQ(again.aux_loss_coef, m.aux_loss_coef);
      EXPECT_TRUE(at::equal(hf.at("model.layers.1.block_sparse_moe.experts.5.w3.weight"), ours.at("layers.1.moe.experts.w3")[5]));
      EXPECT_TRUE(at::equal(hf.at("model.layers.0.block_sparse_moe.experts.2.w2.weight"), ours.at("layers.0.moe.experts.w2")[2]));
      EXPECT_TRUE(at::equal(hf.at("model.layers.0.block_sparse_moe.gate.weight"), ours.at("layers.0.moe.router.weight")));
      EXPECT_EQ(hf.count("model.layers.0.mlp.gate_proj.weight"), 0u);
    }
  }
}

// What MixtralForCausalLM does not compute is refused by name, on export (the model's shape) and
// on import (config.json): dense layers between MoE layers, shared experts, a sigmoid router, and
// top-1 routing (Mixtral renormalises a single gate to 1; meshtrain keeps the probability); the
// router's training noise.
TEST(HuggingFace, MixtralRefusesWhatItDoesNotCompute) {
  const plan::ModelSpec moe = small("moe-tiny", false);
  const std::vector<std::pair<std::function<void(plan::ModelSpec&)>, std::string>> shapes{
      {[](plan::ModelSpec& m) { m.moe_every = 2; }, "dense layers between MoE layers"},
      {[](plan::ModelSpec& m) { m.shared_experts = 1; }, "shared experts"},
      {[](plan::ModelSpec& m) { m.router = "sigmoid"; }, "a sigmoid router"},
      {[](plan::ModelSpec& m) { m.top_k = 1; }, "top_k = 1"}};
  for (const auto& [change, want] : shapes) {
    plan::ModelSpec m = moe;
    change(m);
    try {
      ckpt::hf_family(m);
      ADD_FAILURE() << want << " was exported";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("MixtralForCausalLM does not hold"), std::string::npos) << e.what();
    }
  }
  const nlohmann::json mixtral = ckpt::hf_config(moe);
  for (const auto& [key, value, want] :
       {std::tuple{"router_jitter_noise", nlohmann::json(0.01), "\"router_jitter_noise\" = 0.01 sets multiplicative noise"},
        {"num_experts_per_tok", nlohmann::json(1), "\"num_experts_per_tok\" = 1"},
        {"sliding_window", nlohmann::json(4096), "\"sliding_window\" = 4096 sets sliding-window attention"},
        {"router_aux_loss_coef", nlohmann::json("high"), "\"router_aux_loss_coef\" is \"high\", not a number"}}) {
    nlohmann::json j = mixtral;
    j[key] = value;
    try {
      ckpt::spec_from_hf_config(j);
      ADD_FAILURE() << key << " = " << value.dump() << " was imported";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  nlohmann::json plain = mixtral;
  plain["router_jitter_noise"] = 0, plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(ckpt::spec_from_hf_config(plain).rope_theta, 1e6);
}

// The rotary base in both layouts transformers writes (4.x top-level
// rope_theta, 5.x rope_parameters.rope_theta: it used to be read from the top
// level only, so a Llama 3 config imported with 10000); every field that
// changes the computation and that meshtrain does not model is one error
// naming it (a Llama with attention_bias used to import with its biases
// dropped, rope_scaling ignored).
TEST(HuggingFace, ConfigLayoutsAreReadAndUnmodelledFieldsRefusedByName) {
  const nlohmann::json llama = ckpt::hf_config(small("llama-tiny", false));
  const nlohmann::json gpt2 = ckpt::hf_config(small("gpt-tiny", true));
  nlohmann::json v4 = llama, v5 = llama;
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = nullptr;
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(ckpt::spec_from_hf_config(v4).rope_theta, 500000.0);
  EXPECT_EQ(ckpt::spec_from_hf_config(v5).rope_theta, 500000.0);
  EXPECT_EQ(ckpt::spec_from_hf_config(llama).rope_theta, small("llama-tiny", false).rope_theta);
  const nlohmann::json llama3_scaling = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  nlohmann::json v5_scaled = v5;
  v5_scaled["rope_parameters"]["rope_type"] = "llama3";
  const std::vector<std::tuple<nlohmann::json, std::string, nlohmann::json, std::string>> refused{
      {llama, "attention_bias", true, "\"attention_bias\" = true sets biases on the q, k, v and o projections"},
      {llama, "mlp_bias", true, "\"mlp_bias\" = true sets biases on the MLP's projections"},
      {llama, "hidden_act", "gelu", "\"hidden_act\" = \"gelu\" sets the MLP's activation"},
      {llama, "rope_scaling", llama3_scaling, "\"rope_scaling\" holds \"factor\" = 8.0: rotary position scaling"},
      {v5_scaled, "", nullptr, "\"rope_parameters\" holds \"rope_type\" = \"llama3\": rotary position scaling"},
      {llama, "sliding_window", 4096, "\"sliding_window\" = 4096 sets sliding-window attention"},
      {gpt2, "activation_function", "relu", "\"activation_function\" = \"relu\" sets the MLP's activation"},
      {gpt2, "scale_attn_by_inverse_layer_idx", true, "an extra 1/(layer+1) scaling"},
      {gpt2, "tie_word_embeddings", false, "an output projection apart from the embedding"},
  };
  for (const auto& [base, key, value, want] : refused) {
    nlohmann::json j = base;
    if (!key.empty()) j[key] = value;
    try {
      ckpt::spec_from_hf_config(j);
      ADD_FAILURE() << key << " = " << value.dump() << " was imported";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("does not model"), std::string::npos) << e.what();
    }
  }
  // What meshtrain computes is accepted in every spelling: absent, null, the default values.
  nlohmann::json plain = llama;
  plain["attention_bias"] = false, plain["mlp_bias"] = false, plain["hidden_act"] = "silu", plain["sliding_window"] = nullptr;
  plain["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_NO_THROW(ckpt::spec_from_hf_config(plain));
  nlohmann::json gelu = gpt2;
  gelu["activation_function"] = "gelu_pytorch_tanh", gelu["scale_attn_weights"] = true;
  EXPECT_NO_THROW(ckpt::spec_from_hf_config(gelu));
}

TEST(HuggingFace, MissingOrMisshapedTensorsAreNamed) {
  const plan::ModelSpec m = small("gpt-tiny", true);
  Comm solo("solo", 0);
  Transformer t(m, solo, false, 9);
  auto hf = ckpt::to_hf(ours_of(t), m);
  auto missing = hf;
  missing.erase("transformer.h.1.attn.c_attn.weight");
  try {
    ckpt::from_hf(missing, m);
    ADD_FAILURE() << "missing tensor accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Hugging Face tensor transformer.h.1.attn.c_attn.weight is missing"),
              std::string::npos) << e.what();
  }
  hf["transformer.h.0.mlp.c_fc.weight"] = hf["transformer.h.0.mlp.c_fc.weight"].t().contiguous();
  try {
    ckpt::from_hf(hf, m);
    ADD_FAILURE() << "misshaped tensor accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.0.mlp.c_fc.weight has shape 512x128, expected 128x512"),
              std::string::npos) << e.what();
  }
  plan::ModelSpec odd = m;
  odd.bias = false;  // GPT-2 without biases: no Hugging Face class
  EXPECT_THROW(ckpt::hf_family(odd), std::invalid_argument);
  EXPECT_THROW(ckpt::spec_from_hf_config(nlohmann::json{{"model_type", "bert"}}), std::invalid_argument);
}

TEST(HuggingFace, ExportImportThroughTheCli) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    const std::string cfg = tiny_config(d, preset + ".toml", "") + " --set model.dropout=0.0 --set model.preset='\"" +
                            preset + "\"'";
    const std::string ck = (d.path / ("ck_" + preset)).string(), hf = (d.path / ("hf_" + preset)).string(),
                      back = (d.path / ("back_" + preset)).string();
    auto run = run_command(bin + " train " + cfg + " --set train.stop_after=2 --set checkpoint.dir='\"" + ck + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    run = run_command(bin + " ckpt export " + ck + " --format hf --out " + hf);
    ASSERT_EQ(run.code, 0) << run.output;
    run = run_command(bin + " ckpt export " + ck + " --format hf --out " + hf);
    EXPECT_NE(run.code, 0);  // no overwrite without --force
    EXPECT_NE(run.output.find("pass --force"), std::string::npos) << run.output;
    // A config.json that is not JSON, or holds a field of another type than transformers writes,
    // is named in one error, and nothing is written.
    const std::string broken = (d.path / ("broken_" + preset)).string();
    std::filesystem::copy(hf, broken);
    nlohmann::json config;
    std::ifstream(broken + "/config.json") >> config;
    config["vocab_size"] = "many";
    for (const std::string& text : {std::string("{\"model_type\": \"llama\","), config.dump()}) {
      std::ofstream(broken + "/config.json") << text;
      run = run_command(bin + " ckpt import " + broken + " --out " + back);
      EXPECT_NE(run.code, 0);
      EXPECT_NE(run.output.find(broken), std::string::npos) << run.output;
      EXPECT_NE(run.output.find(text == config.dump() ? "\"vocab_size\" is \"many\"" : "config.json: not JSON"),
                std::string::npos)
          << run.output;
      EXPECT_FALSE(std::filesystem::exists(back)) << run.output;
    }
    run = run_command(bin + " ckpt import " + hf + " --out " + back);
    ASSERT_EQ(run.code, 0) << run.output;
    std::map<std::string, double> first;
    for (const auto& [from, tag] : {std::pair{ck, std::string("orig")}, {back, std::string("back")}}) {
      const std::string m = (d.path / (preset + tag)).string();
      run = run_command(bin + " train " + cfg + " --set train.stop_after=1 --set init.from='\"" + from +
                        "\"' --set train.metrics='\"" + m + "\"'");
      ASSERT_EQ(run.code, 0) << run.output;
      first[tag] = std::stod(losses(m).at(1));
    }
    EXPECT_EQ(first["orig"], first["back"]) << preset;
  }
}

}  // namespace
}  // namespace meshtrain::test
