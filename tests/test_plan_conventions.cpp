// The planner's conventions as switches, each against its source's published
// example: DeepSpeed's model-state estimators (plan/deepspeed_estimate.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/plan/deepspeed_estimate.h"
#include "meshtrain/plan/estimate.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/plan/step_time.h"

namespace meshtrain::plan {
namespace {

double gib(double bytes) { return std::round(bytes / (1 << 30) * 100) / 100; }

// DeepSpeed docs/code-docs/source/memory.rst, the "_all_cold" examples: t5-3b's 2851M parameters, 32M in its
// largest layer, 1 node of 8 GPUs. Published to 0.01 GB (2^30 bytes).
TEST(PlanConventions, DeepSpeedZero2EstimatorReproducesItsExample) {
  const auto rows = deepspeed_zero2(2851e6, 8, 1);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].options, "offload_optimizer=cpu");
  EXPECT_DOUBLE_EQ(gib(rows[0].cpu_bytes), 127.45);
  EXPECT_DOUBLE_EQ(gib(rows[0].gpu_bytes), 5.31);
  EXPECT_EQ(rows[1].options, "offload_optimizer=none");
  EXPECT_DOUBLE_EQ(gib(rows[1].cpu_bytes), 127.45);
  EXPECT_DOUBLE_EQ(gib(rows[1].gpu_bytes), 15.93);
}

TEST(PlanConventions, DeepSpeedZero3EstimatorReproducesItsExample) {
  const auto rows = deepspeed_zero3(2851e6, 32e6, 8, 1);
  const std::vector<std::pair<double, double>> published = {{71.69, 0.12}, {127.45, 0.12}, {63.72, 0.78},
                                                            {127.45, 0.78}, {1.43, 6.09},  {127.45, 6.09}};
  ASSERT_EQ(rows.size(), published.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_DOUBLE_EQ(gib(rows[i].cpu_bytes), published[i].first) << rows[i].options;
    EXPECT_DOUBLE_EQ(gib(rows[i].gpu_bytes), published[i].second) << rows[i].options;
  }
  EXPECT_EQ(rows[0].options, "offload_param=cpu , offload_optimizer=cpu , zero_init=1");
  EXPECT_EQ(rows[5].options, "offload_param=none, offload_optimizer=none, zero_init=0");
  // Across nodes the host's share shrinks with the node count (gpus_factor = 1 / nodes).
  EXPECT_DOUBLE_EQ(deepspeed_zero3(2851e6, 32e6, 8, 4)[0].cpu_bytes, rows[0].cpu_bytes / 4);
}

TEST(PlanConventions, DeepSpeedLargestLayerIsTheWidestModule) {
  // Llama 2 7B: its 32000 x 4096 embedding (131M) outweighs an 11008 x 4096 FFN projection (45M), as t5-3b's
  // 32M largest layer is its 32128 x 1024 embedding.
  EXPECT_DOUBLE_EQ(largest_layer_params(preset("llama2-7b")), 32000.0 * 4096);
  EXPECT_DOUBLE_EQ(largest_layer_params(preset("llama2-70b")), 32000.0 * 8192);
  EXPECT_DOUBLE_EQ(largest_layer_params(preset("gpt2-124m")), 50257.0 * 768);
  const std::string table = format_deepspeed(3, 2851e6, 32e6, 8, 1, deepspeed_zero3(2851e6, 32e6, 8, 1));
  EXPECT_NE(table.find("SW: Model with 2851M total params, 32M largest layer params."), std::string::npos) << table;
  EXPECT_NE(table.find("71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1"),
            std::string::npos)
      << table;
}

// --no-sp: the search keeps tp without sequence parallelism, and its ledger is Korthikanti et al.'s Fig. 1
// baseline for the 22B model (t = 8, micro-batch 4, no recomputation: 59.25 GiB of activations); with SP
// and selective recomputation, their 9.5625 GiB.
TEST(PlanConventions, SequenceParallelismIsASwitch) {
  SearchInput in;
  in.model = preset("korthikanti-22b");
  in.gpu = gpu_preset("a100");
  in.gpus = 8;
  in.seq = 2048;
  in.global_batch = 4;
  in.precision = Precision::Megatron18;
  in.fixed.tp = 8;
  in.fixed.micro_batch = 4;
  in.fixed.zero = 0;
  in.fixed.recompute = Recompute::None;
  in.fixed.sp = false;
  const SearchResult off = search(in);
  ASSERT_TRUE(off.leanest.has_value());
  EXPECT_FALSE(off.leanest->strategy.sp);
  EXPECT_DOUBLE_EQ(off.leanest->memory.peak().line("activations").bytes / (1 << 30), 59.25);
  in.fixed.sp.reset();
  in.fixed.recompute = Recompute::Selective;
  const SearchResult on = search(in);
  ASSERT_TRUE(on.leanest.has_value());
  EXPECT_TRUE(on.leanest->strategy.sp);
  EXPECT_DOUBLE_EQ(on.leanest->memory.peak().line("activations").bytes / (1 << 30), 9.5625);
}

// fp8: the linears' GEMMs at the fp8 rate (MAMF fp8 / fp8 peak) on 1-byte operands, plus the casts of their
// inputs and output gradients; attention stays 16-bit; a GPU without fp8 tensor cores is refused by name.
TEST(PlanConventions, Fp8RunsTheLinearsAtTheFp8Rate) {
  const ModelSpec& m = preset("llama2-70b");
  Strategy s;
  s.tp = 8, s.dp = 1, s.micro_batch = 1, s.global_batch = 1, s.sp = true, s.seq = 4096;
  s.precision = Precision::Bf16;
  const GpuSpec& h100 = gpu_preset("h100");
  const Work bf16 = layer_work(m, s, h100, false);
  s.precision = Precision::Fp8;
  const Work fp8 = layer_work(m, s, h100, false);
  const double rate = (h100.matmul_efficiency * h100.peak_flops) / (h100.fp8_matmul_efficiency * h100.fp8_peak_flops);
  // The math scales by the rates' ratio (794.5 / 1402.6), the loads and stores by 1/2: the whole in between.
  EXPECT_GT(fp8.gemm / bf16.gemm, 0.5);
  EXPECT_LT(fp8.gemm / bf16.gemm, rate * (1 + 1e-9));
  EXPECT_DOUBLE_EQ(fp8.attention, bf16.attention);
  EXPECT_GT(fp8.memory, bf16.memory);  // the casts
  try {
    estimate_step(m, s, gpu_preset("a100"));
    ADD_FAILURE() << "fp8 on an A100 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a100 has no fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::plan
