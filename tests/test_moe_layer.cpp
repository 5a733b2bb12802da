// The mixture-of-experts layer in the model (moe/layer.h): router losses
// reach the gradient with their weight, the model's MoE and dense layers are
// named and built as the spec says, and bad MoE config is one error before
// anything starts.
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/moe/layer.h"
#include "meshtrain/moe/metrics.h"
#include "meshtrain/plan/count.h"
#include "meshtrain/train/config.h"

namespace meshtrain {
namespace {

plan::ModelSpec tiny_moe() {
  plan::ModelSpec m = plan::preset("moe-tiny");
  m.vocab = 64;
  m.seq = 8;
  m.layers = 3;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 24;
  m.experts = 4;
  m.top_k = 2;
  m.expert_ffn = 12;
  m.dropout = 0;
  m.aux_loss_coef = 0.1;
  m.z_loss_coef = 0.01;
  return m;
}

// The layer's output carries the router losses' gradient: equal to adding
// weight x (aux_coef x aux + z_coef x z) to the objective by hand.
TEST(MoeLayer, RouterLossesJoinTheGradientWithTheirWeight) {
  const plan::ModelSpec m = tiny_moe();
  ParamStore store(3, 0, 1);
  MoeLayer layer(store, "l", m, nullptr, nullptr);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor x = at::randn({5, 2, m.hidden}, gen), probe = at::randn({5, 2, m.hidden}, gen);
  const double weight = 0.5;
  auto grads = [&] {
    std::vector<at::Tensor> g;
    for (auto& p : store.params()) {
      g.push_back(p.tensor.grad().clone());
      p.tensor.mutable_grad() = at::Tensor();
    }
    return g;
  };
  (layer.forward(x, weight) * probe).sum().backward();
  const std::vector<at::Tensor> attached = grads();
  EXPECT_EQ(layer.stats().forwards, 1);
  double kept = 0;
  for (double t : layer.stats().tokens) kept += t;
  EXPECT_EQ(kept, 5 * 2 * 2);  // dropless: every token's two choices
  // By hand: the same routing and experts, the losses added to the objective.
  const at::Tensor flat = x.reshape({-1, m.hidden});
  const Routing r = route(at::matmul(flat, layer.router_weight().t()), RouterOptions{4, 2, RouterKind::Softmax, 0});
  EXPECT_NEAR(layer.stats().aux, r.aux_loss.item<double>(), 1e-6);
  EXPECT_NEAR(layer.stats().z, r.z_loss.item<double>(), 1e-6);
  const at::Tensor y = run_experts(flat, r, layer.weights()).view(x.sizes());
  ((y * probe).sum() + weight * (m.aux_loss_coef * r.aux_loss + m.z_loss_coef * r.z_loss)).backward();
  const std::vector<at::Tensor> by_hand = grads();
  ASSERT_EQ(attached.size(), by_hand.size());
  for (size_t i = 0; i < attached.size(); ++i) {
    EXPECT_TRUE(at::allclose(attached[i], by_hand[i], 1e-5, 1e-7)) << store.params()[i].name;
  }
  // Without them (an evaluation forward: nothing recorded, nothing attached) the router's gradient differs.
  layer.stats().reset();
  (layer.forward(x, 0.0) * probe).sum().backward();
  EXPECT_EQ(layer.stats().forwards, 0);
  EXPECT_FALSE(at::allclose(grads()[0], by_hand[0], 1e-5, 1e-7));
}

TEST(MoeModel, MoeLayersSharedExpertsAndDenseLayersAreBuiltAndNamedAsTheSpecSays) {
  plan::ModelSpec m = tiny_moe();
  m.moe_every = 2;  // layers 0 and 2
  m.shared_experts = 1;
  Comm solo("solo", 0);
  Transformer model(m, solo, false, 5);
  std::set<std::string> names;
  for (const auto& p : model.params().params()) names.insert(p.name);
  for (const char* n : {"layers.0.moe.router.weight", "layers.0.moe.experts.w1", "layers.0.moe.experts.w3",
                        "layers.0.moe.experts.w2", "layers.0.moe.shared.gate.weight", "layers.0.moe.shared.down.weight",
                        "layers.1.mlp.gate.weight", "layers.2.moe.router.weight"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  EXPECT_EQ(names.count("layers.1.moe.router.weight"), 0u);
  EXPECT_EQ(names.count("layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(model.params().find("layers.0.moe.experts.w1").full_shape, (std::vector<int64_t>{4, 12, 16}));
  EXPECT_EQ(model.params().find("layers.0.moe.experts.w2").full_shape, (std::vector<int64_t>{4, 16, 12}));
  EXPECT_EQ(model.params().find("layers.0.moe.shared.gate.weight").full_shape, (std::vector<int64_t>{12, 16}));
  EXPECT_EQ(model.moe_layers().size(), 2u);
  // Every parameter trains: the forward reaches the router, experts and shared experts.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const at::Tensor tokens = at::randint(m.vocab, {2, m.seq}, gen, at::kLong);
  model.forward(tokens, tokens, true).sum().backward();
  for (const auto& p : model.params().params()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_GT(p.tensor.grad().abs().sum().item<double>(), 0) << p.name;
  }
  const MoeMetrics mm = collect_moe_metrics(model.moe_layers(), {}, m);
  ASSERT_EQ(mm.tokens.size(), 2u);
  double kept = 0;
  for (double t : mm.tokens[0]) kept += t;
  EXPECT_EQ(kept, 2 * m.seq * m.top_k);
  EXPECT_GE(mm.values.at(0).second, 1.0);  // max / mean
}

// The planner's counts (plan/count.h) are the runtime model's: total
// parameters over every MoE layout (MoE every layer or every other, shared
// experts or none, GELU or SwiGLU, biases or none), and active ones by hand.
TEST(MoeModel, ThePlannersCountsAreTheModelsParameters) {
  Comm solo("solo", 0);
  for (int every : {1, 2}) {
    for (int shared : {0, 2}) {
      for (bool swiglu : {false, true}) {
        plan::ModelSpec m = tiny_moe();
        m.moe_every = every;
        m.shared_experts = shared;
        m.activation = swiglu ? plan::Activation::SwiGLU : plan::Activation::GELU;
        m.bias = !swiglu;
        Transformer model(m, solo, false, 1);
        const plan::ParamCount c = plan::count_params(m, 128);
        EXPECT_EQ(model.params().local_numel(), c.total) << every << shared << swiglu;
        EXPECT_EQ(c.moe_layers, every == 1 ? 3 : 2);
        // Active: every layer's own parameters but the experts not chosen (E - k of each MoE layer).
        const int64_t expert = (swiglu ? 3 : 2) * m.hidden * m.expert_width();
        EXPECT_EQ(c.active, c.total - c.moe_layers * (m.experts - m.top_k) * expert);
      }
    }
  }
}

// Bad MoE config: one error naming the value and the fix, from the config alone.
TEST(MoeConfig, BadInputIsOneClearErrorBeforeAnythingStarts) {
  const auto dir = std::filesystem::temp_directory_path() / ("moe-config-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "c.toml").string();
  std::ofstream(path) << "[model]\npreset = \"moe-tiny\"\n[data]\ntrain = [\"x.bin\"]\n";
  auto error = [&](const std::vector<std::string>& set) {
    try {
      load_train_config(path, set);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NO_THROW(load_train_config(path, {"parallel.ep=4"}));
  EXPECT_NO_THROW(load_train_config(path, {"model.capacity_factor=0"}));  // 0: dropless
  EXPECT_NE(error({"parallel.ep=3"}).find("model.experts = 8 is not divisible by parallel.ep = 3"), std::string::npos)
      << error({"parallel.ep=3"});
  EXPECT_NE(error({"model.top_k=9"}).find("top_k 9 must be in 1..experts (8)"), std::string::npos)
      << error({"model.top_k=9"});
  EXPECT_NE(error({"model.top_k=0"}).find("top_k 0 must be in 1..experts (8)"), std::string::npos)
      << error({"model.top_k=0"});
  EXPECT_NE(error({"model.capacity_factor=-1"}).find("model.capacity_factor = -1 must be >= 0"), std::string::npos)
      << error({"model.capacity_factor=-1"});
  EXPECT_NE(error({"model.router=\"topk\""}).find("router \"topk\" unknown"), std::string::npos)
      << error({"model.router=\"topk\""});
  EXPECT_NE(error({"model.experts=0", "parallel.ep=2"}).find("parallel.ep = 2 splits the experts"), std::string::npos)
      << error({"model.experts=0", "parallel.ep=2"});
  // Refused until the router's statistics are summed over the sequence's pieces (issue 41).
  EXPECT_NE(error({"parallel.cp=2"}).find("model.experts = 8 with parallel.cp = 2: the router would see each cp rank's "
                                          "chunks alone"),
            std::string::npos)
      << error({"parallel.cp=2"});
  const std::vector<std::string> sp_capacity{"parallel.tp=2", "parallel.sp=true", "model.capacity_factor=1.25"};
  EXPECT_NE(error(sp_capacity).find("model.capacity_factor = 1.25 with sequence parallelism"), std::string::npos)
      << error(sp_capacity);
  EXPECT_NO_THROW(load_train_config(path, {"parallel.tp=2", "parallel.sp=true"}));  // dropless under SP: tested
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
