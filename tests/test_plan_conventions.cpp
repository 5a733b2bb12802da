// The planner's conventions as switches, each against its source's published
// example: DeepSpeed's model-state estimators (plan/deepspeed_estimate.h), sequence parallelism, fp8, and
// ZeRO with optimizer offload (ZeRO-Offload).
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
  in.fixed.flash = false;  // Megatron-LM of 2022 materialised the scores (their 5as/h term)
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

TEST(PlanConventions, OffloadRunsAdamOnTheHost) {
  const ModelSpec& m = preset("llama2-7b");
  Strategy s;
  s.dp = 8, s.zero = 2, s.micro_batch = 1, s.global_batch = 24, s.recompute = Recompute::Full;  // 3 micro-batches
  const GpuSpec& a100 = gpu_preset("a100");
  const StepEstimate on_gpu = estimate_step(m, s, a100);
  s.offload = true;
  const StepEstimate off = estimate_step(m, s, a100);
  // DeepSpeed's bytes per parameter of the rank's shard. Gradient copies: 2 B down in the first micro-batch,
  // 2 B up and 2 B down in the second, 2 B up, 2 B down and 4 B (fp32) down in the last. On the host: Adam's
  // 16 B read and 12 B written and the 16-bit cast (read 4, write 2), the DRAM shared by a node's 8 ranks.
  // 16-bit weights up.
  const double shard = static_cast<double>(count_params(m, 128).total) / 8;
  const double pcie = a100.pcie_bw * a100.pcie_efficiency;
  EXPECT_NEAR(off.offload.copies / (shard * (2 + 4 + 8) / pcie), 1.0, 1e-12);
  EXPECT_NEAR(off.offload.host_adam / (shard * 34 / (a100.host_memory_bw * a100.memory_efficiency / 8)), 1.0, 1e-12);
  EXPECT_NEAR(off.offload.params_up / (shard * 2 / pcie), 1.0, 1e-12);
  // The host's step replaces the GPU's Adam and nothing else changes; the copies hid under the backward.
  EXPECT_DOUBLE_EQ(off.step_s - off.optimizer_s, on_gpu.step_s - on_gpu.optimizer_s);
  EXPECT_EQ(off.offload.copies_exposed, 0);
  EXPECT_DOUBLE_EQ(off.optimizer_s, off.offload.host_adam + off.offload.params_up);
  EXPECT_GT(off.optimizer_s, 10 * on_gpu.optimizer_s);
  EstimateOptions after;  // nothing under the backward: every copy is on the step's path
  after.time.dp_overlap = false;
  EXPECT_DOUBLE_EQ(estimate_step(m, s, a100, after).optimizer_s,
                   off.offload.copies + off.offload.host_adam + off.offload.params_up);
  // ZeRO shards over dp x cp: adding cp 2 to dp 4 halves what a rank updates, on the host or on the GPU.
  Strategy dp4 = s, cp2 = s;
  dp4.dp = 4, dp4.global_batch = 12;
  cp2.dp = 4, cp2.cp = 2, cp2.global_batch = 12;
  EXPECT_DOUBLE_EQ(estimate_step(m, cp2, a100).offload.host_adam, off.offload.host_adam);  // as dp 8: 1/8 each
  dp4.offload = cp2.offload = false;
  dp4.zero = cp2.zero = 1;  // gradients held whole: only Adam's share halves
  const double adam4 = estimate_step(m, dp4, a100).optimizer_s, adam2 = estimate_step(m, cp2, a100).optimizer_s;
  EXPECT_LT(adam2, 0.75 * adam4);
  // One GPU has its host's DRAM to itself.
  Strategy one = s;
  one.dp = 1, one.global_batch = 3;
  const StepEstimate alone = estimate_step(m, one, a100);
  EXPECT_NEAR(alone.offload.host_adam / (8 * shard * 34 / (a100.host_memory_bw * a100.memory_efficiency)), 1.0, 1e-12);
  // Without ZeRO there is no shard to move, and a device without a separate host has nowhere to move it.
  s.zero = 0;
  EXPECT_THROW(validate(s, m), std::invalid_argument);
  s.zero = 2;
  GpuSpec cpu = gpu_preset("cpu");
  cpu.peak_flops = 1e12, cpu.memory_bw = 1e11;  // as `--gpu cpu` measures them
  EXPECT_THROW(estimate_step(m, s, cpu), std::invalid_argument);
}

// The cpu device is a host its ranks share: two ranks of a host that multiplies at 100 GFLOP/s each get 50,
// and a data-parallel pair plans its step at half the host's rate, about twice one rank alone on it.
TEST(PlanConventions, CpuRanksShareTheirHost) {
  const GpuSpec one = cpu_device(100e9, 10e9, 16e9, 1), two = cpu_device(100e9, 10e9, 16e9, 2);
  EXPECT_DOUBLE_EQ(two.peak_flops, 50e9);
  EXPECT_DOUBLE_EQ(two.memory_bw, 5e9);
  EXPECT_DOUBLE_EQ(two.memory_bytes, 8e9);
  EXPECT_EQ(two.per_node, 2);
  const ModelSpec& m = preset("gpt2-124m");
  Strategy s;
  s.precision = Precision::Fp32, s.seq = 256, s.micro_batch = 4, s.global_batch = 4;
  const double alone = estimate_step(m, s, one).compute_s;
  s.dp = 2, s.global_batch = 8;
  EXPECT_NEAR(estimate_step(m, s, two).compute_s / alone, 2.0, 1e-9);
  EXPECT_THROW(cpu_device(1, 1, 1, 0), std::invalid_argument);
}

// Ren et al., ZeRO-Offload (USENIX ATC'21, arXiv 2101.06840), abstract: "models with over 13 billion
// parameters on a single GPU" (a V100 32 GB). With ZeRO-2 offload the device holds the 16-bit weights and a
// gradient bucket; the fp32 weights, gradients and Adam states are on the host.
TEST(PlanConventions, OffloadFitsThirteenBillionParametersOnOneV100) {
  SearchInput in;
  in.model = preset("llama2-13b");
  in.gpu = gpu_preset("v100");
  in.gpus = 1, in.seq = 1024, in.global_batch = 8;
  EXPECT_TRUE(search(in).ranked.empty());
  in.fixed.offload = true;
  const SearchResult r = search(in);
  ASSERT_FALSE(r.ranked.empty());
  const Candidate& best = r.ranked.front();
  EXPECT_TRUE(best.strategy.offload);
  const StageLedger& l = best.memory.first;
  EXPECT_TRUE(l.line("optimizer states").host);
  EXPECT_LE(best.peak_bytes, in.gpu.memory_bytes);
  EXPECT_GE(l.line("parameters").bytes, 2 * 13e9);  // the 16-bit weights stay
  if (best.strategy.zero >= 2) EXPECT_TRUE(l.line("gradients").host);
}

}  // namespace
}  // namespace meshtrain::plan
