// The planner against published figures (tolerances stated per test) and its
// own rules.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/plan/gemms.h"
#include "meshtrain/plan/partition.h"
#include "meshtrain/plan/schedule.h"
#include "meshtrain/plan/explain.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/plan/traffic.h"

namespace meshtrain::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

Strategy strategy(int tp, int pp, int64_t mb, int64_t global_batch, bool sp, Recompute rc) {
  Strategy s;
  s.tp = tp;
  s.pp = pp;
  s.micro_batch = mb;
  s.global_batch = global_batch;
  s.sp = sp;
  s.recompute = rc;
  s.precision = Precision::Megatron18;
  return s;
}

// Narayanan et al. (arXiv 2104.04473) Table 1, billions, printed to 0.1: our
// exact count must round to the printed value.
TEST(Plan, MegatronTable1ParameterCounts) {
  const std::pair<const char*, double> table[] = {
      {"megatron-1.7b", 1.7},   {"megatron-3.6b", 3.6},   {"megatron-7.5b", 7.5},   {"megatron-18b", 18.4},
      {"megatron-39b", 39.1},   {"megatron-76b", 76.1},   {"megatron-145b", 145.6}, {"megatron-310b", 310.1},
      {"megatron-530b", 529.6}, {"megatron-1t", 1008.0}};
  for (auto [name, billions] : table) {
    const double got = count_params(preset(name)).total / 1e9;
    EXPECT_NEAR(got, billions, 0.05) << name;
  }
}

TEST(Plan, ParameterCountsOfKnownModels) {
  // GPT-2 124M: 124,439,808 with tied embeddings (the HF count).
  EXPECT_EQ(count_params(preset("gpt2-124m")).total, 124439808);
  // Llama 2 7B: 6,738,415,616 (the HF count).
  EXPECT_EQ(count_params(preset("llama2-7b")).total, 6738415616);
  // Llama 3 8B: 8,030,261,248.
  EXPECT_EQ(count_params(preset("llama3-8b")).total, 8030261248);
}

// Korthikanti et al. Fig. 1 (22B, t = 8, micro-batch 4, s = 2048): model states
// 45.5625 GiB (18 B x 12Lh^2 / t: the figure counts the layers' weight matrices),
// activations 59.25 GiB without and 9.5625 GiB with SP + selective recomputation.
// Exact in binary floating point.
TEST(Plan, KorthikantiFigure1For22B) {
  const ModelSpec& m = preset("korthikanti-22b");
  const double weights = 12.0 * m.layers * m.hidden * m.hidden / 8;
  EXPECT_DOUBLE_EQ(model_state_bytes(weights, Precision::Megatron18, 0, 1).total() / kGiB, 45.5625);
  // Our exact count adds biases and norms: within 0.1%.
  const double exact = static_cast<double>(count_params(m).layer.total()) * m.layers / 8;
  EXPECT_NEAR(model_state_bytes(exact, Precision::Megatron18, 0, 1).total() / kGiB, 45.5625, 45.5625e-3);

  Strategy plain = strategy(8, 1, 4, 4, false, Recompute::None);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, plain) * m.layers / kGiB, 59.25);
  Strategy sp_sel = strategy(8, 1, 4, 4, true, Recompute::Selective);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, sp_sel) * m.layers / kGiB, 9.5625);
}

// The startup estimate of `meshtrain train` counts what the run keeps: fp32
// runs keep 4-byte activations (16-bit ones 2; dropout masks 1 either way);
// naive attention keeps the a·s² probabilities, tiled attention and ring
// attention only the fp32 log-sum-exp (4asb), whatever the sequence.
TEST(Plan, ActivationsCountPrecisionAndTheAttentionAlgorithm) {
  ModelSpec m = preset("gpt-tiny");
  m.dropout = 0;
  m.seq = 8192;
  Strategy s = strategy(1, 1, 1, 1, false, Recompute::None);
  s.micro_batch = 4;
  s.seq = 8192;
  s.precision = Precision::Fp32;
  const double fp32_naive = layer_activation_bytes(m, s);
  s.precision = Precision::Bf16;
  EXPECT_DOUBLE_EQ(fp32_naive, 2 * layer_activation_bytes(m, s));
  s.precision = Precision::Fp32;
  s.flash = true;
  const double a = m.heads, sq = 8192, b = 4;
  EXPECT_DOUBLE_EQ(fp32_naive - layer_activation_bytes(m, s), 4 * a * sq * sq * b - 4 * a * sq * b);
  s.flash = false;
  s.cp = 4;  // ring attention: a quarter of the tokens, no s² term
  const double ring = layer_activation_bytes(m, s);
  s.flash = true;
  EXPECT_DOUBLE_EQ(ring, layer_activation_bytes(m, s));
  s.cp_impl = CpImpl::Ulysses;
  s.flash = false;
  // A naive core under Ulysses keeps (S / cp) x S probabilities per head.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, s) - ring, 4 * a * (sq / 4) * sq * b - 4 * a * (sq / 4) * b);
}

// Korthikanti Fig. 1, 1T (t = 8, p = 64): model states 32.959 GiB; activations
// of the first stage (64 micro-batches in flight x 2 layers) 131.25 / 26.5625 GiB.
TEST(Plan, KorthikantiFigure1For1T) {
  const ModelSpec& m = preset("korthikanti-1t");
  const double weights = 12.0 * m.layers * m.hidden * m.hidden / (8 * 64);
  EXPECT_NEAR(model_state_bytes(weights, Precision::Megatron18, 0, 1).total() / kGiB, 32.959, 0.0005);
  MemoryPlan plain = memory_ledger(m, strategy(8, 64, 1, 64, false, Recompute::None));
  EXPECT_DOUBLE_EQ(plain.first.line("activations").bytes / kGiB, 131.25);
  MemoryPlan lean = memory_ledger(m, strategy(8, 64, 1, 64, true, Recompute::Selective));
  EXPECT_DOUBLE_EQ(lean.first.line("activations").bytes / kGiB, 26.5625);
  // The last stage holds one micro-batch, plus the fp32 logits.
  EXPECT_LT(lean.last.line("activations").bytes, lean.first.line("activations").bytes / 32);
  EXPECT_GT(lean.last.line("logits and head input").bytes, 0);
}

// ZeRO paper (arXiv 1910.02054) Fig. 1: 7.5B parameters, 64 GPUs, mixed-precision
// Adam: 120 / 31.4 / 16.6 / 1.9 GB per GPU for stages 0-3 (printed to 0.1 GB).
TEST(Plan, ZeroPaperExample) {
  const double want[] = {120.0, 31.4, 16.6, 1.9};
  for (int z = 0; z <= 3; ++z) {
    const double gb = model_state_bytes(7.5e9, Precision::Bf16, z, 64).total() / 1e9;
    EXPECT_NEAR(gb, want[z], 0.05) << "ZeRO-" << z;
  }
}

// NeMo's lean fine-tuning states (Strategy::bf16_optimizer, fp8_params): Adam's master, m and v in 6 bytes, not
// 12; each linear weight its FP8 byte alone. 70B on tp 4 x pp 4 (NeMo 24.07's SFT layout): per parameter of the
// first stage 2 + 2 + 12 bytes and 1 more for each linear's FP8 copy, against 1 (linears) or 2 (the rest) + 2 + 6.
TEST(Plan, LeanOptimizerAndFp8WeightsInTheLedger) {
  const ModelSpec& m = preset("llama2-70b");
  Strategy s;
  s.tp = 4, s.pp = 4, s.sp = true, s.seq = 4096, s.global_batch = 32, s.precision = Precision::Fp8;
  const StageLedger plain = memory_ledger(m, s).first;
  s.bf16_optimizer = s.fp8_params = true;
  const StageLedger lean = memory_ledger(m, s).first;
  const double P = plain.params, linear = plain.line("fp8 weight copies").bytes;  // 1 B per linear weight
  EXPECT_DOUBLE_EQ(lean.line("optimizer states").bytes, 6 * P);
  EXPECT_DOUBLE_EQ(plain.line("optimizer states").bytes, 12 * P);
  EXPECT_DOUBLE_EQ(lean.line("parameters").bytes, 2 * P - linear);
  EXPECT_DOUBLE_EQ(lean.line("gradients").bytes, plain.line("gradients").bytes);
  EXPECT_THROW(lean.line("fp8 weight copies"), std::out_of_range);
  EXPECT_NEAR(linear / P, 0.98, 0.01);  // the embedding is the rest of stage 0
  s.fp8_transpose = true;  // a transposed FP8 copy, where kept, is still one
  EXPECT_DOUBLE_EQ(memory_ledger(m, s).first.line("fp8 weight copies").bytes, linear);
  // Each needs its precision: FP8 weights an FP8 run, bf16 states a 16-bit one.
  s.precision = Precision::Bf16;
  EXPECT_THROW(validate(s, m), std::invalid_argument);
  s.fp8_params = false;
  EXPECT_NO_THROW(validate(s, m));
  s.precision = Precision::Fp32;
  EXPECT_THROW(validate(s, m), std::invalid_argument);
}

TEST(Plan, CommunicationVolumesFollowTheFormulas) {
  const ModelSpec& m = preset("gpt2-124m");
  const GpuSpec& gpu = gpu_preset("h100");
  Strategy ddp;
  ddp.dp = 4;
  ddp.global_batch = 8;
  ddp.precision = Precision::Fp32;
  const double psi = static_cast<double>(count_params(m, 128).total);
  EXPECT_DOUBLE_EQ(estimate_step(m, ddp, gpu).traffic["dp"].bytes, 2 * 3.0 / 4 * psi * 4);
  // One micro-batch per step: ZeRO-3 moves 1.5x DDP's bytes (the ZeRO paper's sec. 7.2.2).
  Strategy z3 = ddp;
  z3.zero = 3;
  z3.global_batch = 4;
  EXPECT_DOUBLE_EQ(estimate_step(m, z3, gpu).traffic["dp"].bytes / estimate_step(m, ddp, gpu).traffic["dp"].bytes, 1.5);
  // Two: ZeRO-3 gathers and reduce-scatters again for the second (DeepSpeed, FSDP); ZeRO-2 reduce-scatters
  // again, and gathers the updated parameters once; DDP and ZeRO-1 reduce once.
  z3.global_batch = 8;
  EXPECT_DOUBLE_EQ(estimate_step(m, z3, gpu).traffic["dp"].bytes / estimate_step(m, ddp, gpu).traffic["dp"].bytes, 3.0);
  Strategy z2 = z3, z1 = z3;
  z2.zero = 2, z1.zero = 1;
  EXPECT_DOUBLE_EQ(estimate_step(m, z2, gpu).traffic["dp"].bytes / estimate_step(m, ddp, gpu).traffic["dp"].bytes, 1.5);
  EXPECT_DOUBLE_EQ(estimate_step(m, z1, gpu).traffic["dp"].bytes / estimate_step(m, ddp, gpu).traffic["dp"].bytes, 1.0);
  // TP: 4 all-reduces of b.s.h per layer per micro-batch, 2(t-1)/t each, 2 bytes.
  Strategy tp;
  tp.tp = 4;
  tp.global_batch = 2;
  tp.micro_batch = 1;
  EXPECT_DOUBLE_EQ(estimate_step(m, tp, gpu).traffic["tp"].bytes, 12 * 2 * 4 * 2 * 0.75 * 1024 * 768 * 2);
}

TEST(Plan, BubbleFractions) {
  Strategy s;
  s.pp = 4;
  s.global_batch = 8;
  EXPECT_DOUBLE_EQ(bubble_fraction(s), 3.0 / 8);
  s.schedule = Schedule::Interleaved;
  s.vpp = 2;
  EXPECT_DOUBLE_EQ(bubble_fraction(s), 3.0 / 16);
  s.schedule = Schedule::ZBH1;
  s.vpp = 1;
  EXPECT_DOUBLE_EQ(bubble_fraction(s), 3.0 / 24);
}

TEST(Plan, SearchFindsAPlanForLlama2_70BOn64H100) {
  SearchInput in;
  in.model = preset("llama2-70b");
  in.gpu = gpu_preset("h100");
  in.gpus = 64;
  in.seq = 4096;
  in.global_batch = 64;
  SearchResult r = search(in);
  ASSERT_FALSE(r.ranked.empty());
  const Candidate& best = r.ranked.front();
  EXPECT_LE(best.peak_bytes, 80e9);
  EXPECT_EQ(best.strategy.world(), 64);
  for (const std::string axis : {"tp", "cp", "ep", "dp", "pp"}) {  // each axis's link as the mesh places it
    EXPECT_EQ(best.estimate.traffic.at(axis).inter_node, axis_crosses_nodes(best.strategy, axis, 8)) << axis;
  }
  EXPECT_LE(best.strategy.tp, 8) << "tp must stay inside a node";
  EXPECT_GT(best.estimate.mfu, 0.0);
  EXPECT_LT(best.estimate.mfu, in.gpu.matmul_efficiency);  // no faster than its GEMMs at their best shape
  bool order_line = false;
  for (const auto& l : r.explanation) order_line = order_line || l.find("Mesh order") != std::string::npos;
  EXPECT_TRUE(order_line);
}

// The explanation of the 70B plan gives each choice its deciding numbers: the axis's own bytes and seconds, and
// the best plan without the choice, which must be slower than the chosen one (or not fit); runner-ups say what
// made them slower.
TEST(Plan, ExplanationStatesTheDecidingNumbers) {
  SearchInput in;
  in.model = preset("llama2-70b");
  in.gpu = gpu_preset("h100");
  in.gpus = 64;
  in.seq = 4096;
  in.global_batch = 256;
  SearchResult r = search(in);
  ASSERT_GE(r.ranked.size(), 2u);
  const Candidate& best = r.ranked.front();
  const Strategy& s = best.strategy;
  auto line_of = [&](const std::string& head) -> std::string {
    for (const auto& l : r.explanation)
      if (l.rfind("   " + head, 0) == 0) return l;
    return "";
  };
  // Every choice that is not the plain default has a line, and its verdict holds.
  std::vector<std::pair<std::string, std::string>> chosen;  // line head, axis
  if (s.zero > 0) chosen.push_back({fmt::format("ZeRO-{} over {} ranks", s.zero, s.shard_group() * s.cp * s.ep), ""});
  if (s.tp > 1) chosen.push_back({fmt::format("TP={}", s.tp), "tp"});
  if (s.pp > 1) chosen.push_back({fmt::format("PP={}", s.pp), "pp"});
  if (s.cp > 1) chosen.push_back({fmt::format("CP={}", s.cp), "cp"});
  ASSERT_FALSE(chosen.empty());
  for (const auto& [head, axis] : chosen) {
    const std::string l = line_of(head);
    ASSERT_FALSE(l.empty()) << head;
    if (!axis.empty()) {
      const AxisTraffic& t = best.estimate.traffic.at(axis);
      EXPECT_NE(l.find(human_bytes(t.bytes) + " per step"), std::string::npos) << l;
      EXPECT_NE(l.find(fmt::format("{:.3f} s on the wire, {:.3f} s exposed", t.seconds, t.exposed)), std::string::npos)
          << l;
    }
    const size_t faster = l.find("faster: "), fit = l.find("needed to fit: ");
    ASSERT_TRUE(faster != std::string::npos || fit != std::string::npos) << l;
    if (faster != std::string::npos) {
      const size_t at = l.find(", takes ", faster);
      ASSERT_NE(at, std::string::npos) << l;
      EXPECT_GT(std::stod(l.substr(at + 8)), best.estimate.step_s) << l;
      const size_t pct = l.find("s (+", at);  // why_slower's "+x%: what grew"
      ASSERT_NE(pct, std::string::npos) << l;
      EXPECT_GT(std::stod(l.substr(pct + 3)), 0.0) << l;
      EXPECT_EQ(l.find(s.describe(), faster), std::string::npos) << "the alternative is the plan itself: " << l;
    }
  }
  EXPECT_EQ(line_of("Sequence").find("too long"), std::string::npos);
  const std::string lost = why_slower(r.ranked[1], best);
  EXPECT_EQ(lost.front(), '+') << lost;
  EXPECT_NE(lost.find(" s"), std::string::npos) << lost;
  EXPECT_FALSE(r.rules.empty());
}

TEST(Plan, SearchSaysWhenNothingFits) {
  SearchInput in;
  in.model = preset("llama3-405b");
  in.gpu = gpu_preset("h100");
  in.gpus = 8;
  in.seq = 8192;
  in.global_batch = 8;
  SearchResult r = search(in);
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_FALSE(r.explanation.empty());
  EXPECT_NE(r.explanation.front().find("Nothing fits"), std::string::npos) << r.explanation.front();
}

TEST(Plan, MeshOrderPutsTpInsideANode) {
  Strategy s;
  s.tp = 8;
  s.dp = 4;
  s.pp = 2;
  EXPECT_EQ(mesh_order(s, 8), "tp=8 [inside a node] -> dp=4 [across nodes] -> pp=2 [across nodes]");
}

TEST(Plan, BadInputIsAClearError) {
  EXPECT_THROW(preset("gpt5"), std::invalid_argument);
  EXPECT_THROW(gpu_preset("tpu9"), std::invalid_argument);
  SearchInput in;
  in.model = preset("llama2-7b");
  in.gpu = gpu_preset("h100");
  in.gpus = 0;
  EXPECT_THROW(search(in), std::invalid_argument);
  in.gpus = 12;
  in.fixed.tp = 8;
  try {
    search(in);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
  in.fixed.tp.reset();
  in.gpus = 8;
  in.seq = -5;
  EXPECT_THROW(search(in), std::invalid_argument);
  Strategy s;
  s.tp = 3;
  try {
    validate(s, preset("llama2-7b"));
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tp 3 does not divide"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::plan

// ---------------------------------------------------------------- pipeline schedules
namespace meshtrain::plan {
namespace {

TEST(Schedule, BubblesMatchTheFormulas) {
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p, 4 * p}) {
      SCOPED_TRACE(::testing::Message() << "pp " << p << " m " << m);
      // GPipe and 1F1B (F = 1, B = 2): bubble (p - 1) / (m + p - 1).
      for (Schedule k : {Schedule::GPipe, Schedule::OneFOneB}) {
        const SimulationResult r = simulate(build_schedule(k, p, m));
        EXPECT_NEAR(r.bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12) << to_string(k);
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_EQ(r.peak_in_flight[rank], k == Schedule::GPipe ? m : std::min(p - rank, m)) << to_string(k);
        }
      }
      // Interleaved, v = 2 (each virtual stage half a rank's layers): (p - 1) / (v m + p - 1)
      // (Narayanan et al. 2021, sec. 2.2); rank 0 holds (p-1)*2 + (v-1)*p + 1 units of activations.
      const SimulationResult iv = simulate(build_schedule(Schedule::Interleaved, p, m, 2));
      EXPECT_NEAR(iv.bubble_fraction, (p - 1.0) / (2.0 * m + p - 1.0), 1e-12);
      EXPECT_EQ(iv.peak_in_flight[0], std::min((p - 1) * 2 + p + 1, 2 * m));
      // ZB-H1 with F = B = W = 1: bubble time (p - 1) x 1 instead of 1F1B's (p - 1) x 3
      // (Qi et al. 2024, sec. 3); activation memory as 1F1B's.
      ActionCosts unit;
      unit.backward = 2;
      const SimulationResult zb = simulate(build_schedule(Schedule::ZBH1, p, m), unit);
      EXPECT_NEAR(zb.bubble_fraction, (p - 1.0) / (3.0 * m + p - 1.0), 1e-12);
      for (int rank = 0; rank < p; ++rank) EXPECT_LE(zb.peak_in_flight[rank], std::min(p - rank, m));
    }
  }
}

// Unequal stages: the slowest sets the pace. 1F1B, pp 2, 2 micro-batches, stage 0 half stage 1's work
// (F = 1, B = 2 on stage 1): rank 1 runs F B F B from 0.5 to 6.5, rank 0 waits for its gradients and
// ends at 7.5, busy 3 of it: idle 60% (the 59% a 6/6 cut of gpt2-124m measures), where equal stages
// give (p - 1) / (m + p - 1) = 33%.
TEST(Schedule, TheSlowestStageSetsThePace) {
  ActionCosts c;
  c.stage_scale = {0.5, 1.0};
  const SimulationResult r = simulate(build_schedule(Schedule::OneFOneB, 2, 2), c);
  EXPECT_DOUBLE_EQ(r.makespan, 7.5);
  EXPECT_DOUBLE_EQ(r.idle_fraction(0), 0.6);
  EXPECT_DOUBLE_EQ(r.idle_fraction(1), 0.2);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.4);
  const SimulationResult even = simulate(build_schedule(Schedule::OneFOneB, 2, 2));
  EXPECT_DOUBLE_EQ(even.idle_fraction(0), even.bubble_fraction);
  c.stage_scale = {1.0};
  EXPECT_THROW(simulate(build_schedule(Schedule::OneFOneB, 2, 2), c), std::invalid_argument);
}

std::string error_of(const PipelineSchedule& s) {
  try {
    simulate(s);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "";
}

TEST(Schedule, CheckerRejectsBrokenSchedules) {
  // A receive removed: the send has no partner.
  PipelineSchedule s = build_schedule(Schedule::OneFOneB, 2, 2);
  auto& r1 = s.ranks[1];
  r1.erase(std::find(r1.begin(), r1.end(), Action{Op::RecvAct, 1, 0, 0}));
  std::string e = error_of(s);
  EXPECT_NE(e.find("rank 0: send act m1 s0 -> rank 1 has no matching receive on rank 1"), std::string::npos) << e;
  // The receive moved after the forward that needs it.
  s = build_schedule(Schedule::OneFOneB, 2, 2);
  auto& q = s.ranks[1];
  auto recv = std::find(q.begin(), q.end(), Action{Op::RecvAct, 0, 0, 0});
  std::iter_swap(recv, recv + 1);
  e = error_of(s);
  EXPECT_NE(e.find("rank 1: F m0 s1 needs the activation of m0 s0"), std::string::npos) << e;
  // A cycle: rank 0 waits for m0's gradient before running m0's forward.
  s = build_schedule(Schedule::OneFOneB, 2, 2);
  auto& z = s.ranks[0];
  const Action grad{Op::RecvGrad, 0, 1, 1};
  z.erase(std::find(z.begin(), z.end(), grad));
  z.insert(z.begin(), grad);
  e = error_of(s);
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 waits at recv grad m0 s1 <- rank 1"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 waits at recv act m0 s0 <- rank 0"), std::string::npos) << e;
  // A compute action dropped.
  s = build_schedule(Schedule::GPipe, 2, 2);
  s.ranks[0].erase(std::find(s.ranks[0].begin(), s.ranks[0].end(), Action{Op::Backward, 1, 0, -1}));
  e = error_of(s);
  EXPECT_NE(e.find("rank 0: B m1 s0 is missing"), std::string::npos) << e;
}

TEST(Schedule, BadSizesAreClearErrors) {
  EXPECT_THROW(build_schedule(Schedule::Interleaved, 4, 6, 2), std::invalid_argument);  // 6 % 4
  EXPECT_THROW(build_schedule(Schedule::Interleaved, 4, 8, 1), std::invalid_argument);
  EXPECT_THROW(build_schedule(Schedule::OneFOneB, 4, 8, 2), std::invalid_argument);
  EXPECT_THROW(build_schedule(Schedule::GPipe, 0, 8), std::invalid_argument);
  const std::string t = timeline(build_schedule(Schedule::OneFOneB, 2, 2), simulate(build_schedule(Schedule::OneFOneB, 2, 2)));
  EXPECT_NE(t.find("rank  0 |F0 F1  .  . B0 B0  . B1 B1 |"), std::string::npos) << t;
  EXPECT_NE(t.find("rank  1 | . F0 B0 B0 F1 B1 B1  .  . |"), std::string::npos) << t;
}

}  // namespace
}  // namespace meshtrain::plan

namespace meshtrain::plan {
namespace {

TEST(Partition, BalancesParametersAndChecksLists) {
  // Uniform layers, no embedding weight to speak of: an even split.
  ModelSpec m = preset("llama2-7b");
  auto even = partition_layers(m, 4);
  ASSERT_EQ(even.size(), 4u);
  EXPECT_EQ(even[0].first, 0);
  EXPECT_EQ(even[3].last, 32);
  for (size_t s = 1; s < even.size(); ++s) EXPECT_EQ(even[s].first, even[s - 1].last);
  // The embedding and head (32000 x 4096 each, ~0.65 of a layer's 202M) push
  // layers off the first and last stages only when it lowers the maximum.
  const int64_t max_stage = std::max_element(even.begin(), even.end(), [](auto& a, auto& b) { return a.params < b.params; })->params;
  const ParamCount c = count_params(m);
  EXPECT_LE(max_stage, 9 * c.layer.total() + c.embedding);
  // gpt2-124m on 4 stages: the tied 50257 x 768 embedding (38.6M, ~5 layers of 7.1M)
  // sits on stage 0 and again on the last: those stages get fewer layers.
  ModelSpec g = preset("gpt2-124m");
  auto gs = partition_layers(g, 4);
  EXPECT_LT(gs[0].last - gs[0].first, gs[1].last - gs[1].first);
  EXPECT_LT(gs[3].last - gs[3].first, gs[2].last - gs[2].first);
  // Every stage non-empty, all layers assigned.
  int64_t total = 0;
  for (const auto& s : gs) {
    EXPECT_GE(s.last - s.first, 1);
    total += s.last - s.first;
  }
  EXPECT_EQ(total, g.layers);
  // Balanced by compute, the embedding lookup is free: stage 0 gets more layers
  // than the last stage, which multiplies by the 50257 x 768 head.
  auto gc = partition_layers(g, 2, {}, Balance::Compute);
  EXPECT_GT(gc[0].last - gc[0].first, gc[1].last - gc[1].first);
  auto gp = partition_layers(g, 2);
  EXPECT_EQ(gp[0].last - gp[0].first, gp[1].last - gp[1].first);  // parameters: symmetric (tied copy on both ends)
  // Work per token, whatever the balance: the layers' weights, and the head's on the last stage only.
  EXPECT_EQ(gp[0].work, gp[0].params - count_params(g).embedding - count_params(g).positions);
  EXPECT_EQ(gp[1].work - gp[0].work, count_params(g).embedding);  // the tied head's V x h
  EXPECT_EQ(gc[0].work + gc[1].work, gp[0].work + gp[1].work);
  // A user list is taken as given, and checked.
  auto user = partition_layers(g, 3, {2, 5, 5});
  EXPECT_EQ(user[1].first, 2);
  EXPECT_EQ(user[2].last, 12);
  EXPECT_THROW(partition_layers(g, 3, {2, 5, 4}), std::invalid_argument);  // sums to 11
  EXPECT_THROW(partition_layers(g, 3, {0, 6, 6}), std::invalid_argument);
  EXPECT_THROW(partition_layers(g, 4, {4, 4, 4}), std::invalid_argument);
  try {
    partition_layers(g, 16);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("12 layers, too few for 16 pipeline stages"), std::string::npos) << e.what();
  }
  // The ledger counts each rank's own layers: an even split by default, the strategy's cut when it has one
  // (a training run's: the engine's), checked like a user list.
  Strategy st = strategy(1, 2, 1, 8, false, Recompute::None);
  EXPECT_EQ(memory_ledger(g, st).first.layers, 6);
  st.pp_layers = {9, 3};
  const MemoryPlan cut = memory_ledger(g, st);
  EXPECT_EQ(cut.first.layers, 9);
  EXPECT_EQ(cut.last.layers, 3);
  EXPECT_DOUBLE_EQ(cut.first.line("activations").bytes / memory_ledger(g, strategy(1, 2, 1, 8, false, Recompute::None))
                                                             .first.line("activations").bytes,
                   1.5);
  st.pp_layers = {9, 4};
  EXPECT_THROW(memory_ledger(g, st), std::invalid_argument);
}

// ZeRO-3's gathered units (parallel/data/zero.h): two adjacent units' parameters (the embedding,
// the layers, the head, in forward order) and the largest unit's gradients; a tied model holds unit
// 0 (embedding, positions, final norm) throughout, plus two layers.
TEST(Partition, Zero3GathersTwoAdjacentUnits) {
  for (bool tied : {true, false}) {
    ModelSpec m = preset("gpt2-124m");
    m.tied = tied;
    Strategy s = strategy(1, 1, 1, 8, false, Recompute::None);
    s.zero = 3;
    s.dp = 8;
    s.precision = Precision::Fp32;
    const ParamCount c = count_params(m, 128);
    const double layer = c.layer.total(), embedding = c.embedding + c.positions, head = c.final_norm + c.head;
    const double expect = tied ? (embedding + head + 2 * layer) * 4 + (embedding + head) * 4
                               : std::max(embedding + layer, layer + head) * 4 + std::max(embedding, head) * 4;
    EXPECT_DOUBLE_EQ(memory_ledger(m, s).first.line("ZeRO-3 gathered units").bytes, expect) << "tied " << tied;
  }
}

}  // namespace
}  // namespace meshtrain::plan

namespace meshtrain::plan {
namespace {

// The runtime's accounting (traffic.h): DDP all-reduces 2 ring(n) 4P; ZeRO-1
// moves the same; ZeRO-3 gathers twice more, less unit 0 in backward: ~1.5x.
TEST(Traffic, ZeroVolumesAgainstDdp) {
  const ModelSpec m = preset("llama2-7b");
  Strategy s;
  s.dp = 8;
  s.micro_batch = 1;
  s.global_batch = 8;
  s.seq = 4096;
  s.precision = Precision::Fp32;
  const RankTraffic ddp = rank_traffic(m, s, 0, {{0, m.layers, 0}});
  EXPECT_NEAR(ddp.dp, 2 * 7.0 / 8 * 4 * ddp.params, 1e3);
  s.zero = 1;
  EXPECT_NEAR(rank_traffic(m, s, 0, {{0, m.layers, 0}}).dp / ddp.dp, 1.0, 1e-6);
  s.zero = 3;
  const double ratio = rank_traffic(m, s, 0, {{0, m.layers, 0}}).dp / ddp.dp;
  EXPECT_GT(ratio, 1.45);
  EXPECT_LT(ratio, 1.5);
  EXPECT_EQ(ddp.tp, 0);  // tp 1
  s.tp = 8;
  s.sp = true;
  // 8 collectives per layer + embedding and head, each moving ring(8) of b x s x h x 4 bytes; the
  // cross-entropy's 3 all-reduces of [s, b]; once, the all-reduce of the norms' partial gradients.
  const double T = 4096.0 * m.hidden * 4, norms = (2.0 * m.layers + 1) * m.hidden;
  EXPECT_NEAR(rank_traffic(m, s, 0, {{0, m.layers, 0}}).tp,
              7.0 / 8 * (T * (8 * m.layers + 4) + 3 * 2 * 4096 * 4) + 2 * 7.0 / 8 * 4 * norms, 1);
}

}  // namespace
}  // namespace meshtrain::plan

namespace meshtrain::plan {
namespace {

// The step's GEMMs (plan/gemms.h) add up to the model FLOPs of the step: 6 x
// tokens x matmul weights (the padded head included) + the attention scores'
// 12 x layers x tokens x seq x heads x head_dim (forward 4, backward 8).
TEST(Plan, StepGemmsAddUpToTheStepsModelFlops) {
  for (const char* name : {"gpt2-124m", "llama-tiny", "llama2-7b"}) {
    const ModelSpec m = preset(name);
    const int64_t b = 3, s = 64, n = b * s;
    double flops = 0;
    for (const auto& g : step_gemms(m, b, s)) flops += g.flops();
    const double want = 6.0 * n * static_cast<double>(count_params(m, 128).matmul_active) +
                        12.0 * m.layers * n * s * m.heads * m.head_dim();
    EXPECT_DOUBLE_EQ(flops, want) << name;
  }
  ModelSpec moe = preset("llama-tiny");
  moe.experts = 4, moe.top_k = 2;
  EXPECT_THROW(step_gemms(moe, 1, 8), std::invalid_argument);
}

TEST(Plan, AttentionAutoIsTiledFromFourTiles) {
  EXPECT_EQ(ModelSpec{}.attention, AttentionImpl::Auto);
  EXPECT_EQ(kAutoTiledKeys, 2048);
  EXPECT_FALSE(attention_tiled(AttentionImpl::Auto, kAutoTiledKeys - 1));
  EXPECT_TRUE(attention_tiled(AttentionImpl::Auto, kAutoTiledKeys));
  EXPECT_TRUE(attention_tiled(AttentionImpl::Auto, 16, /*documents=*/true));
  EXPECT_FALSE(attention_tiled(AttentionImpl::Naive, 1 << 20));
  EXPECT_TRUE(attention_tiled(AttentionImpl::Tiled, 16));
  // Auto is sdpa wherever sdpa computes the case; on the CPU with cp 1 only (a chunk of queries that sees
  // earlier chunks is not sdpa's top-left causal mask, and the CPU's cp paths keep their tested kernels).
  EXPECT_TRUE(attention_sdpa(AttentionImpl::Auto, 0.0, false, 1, false));
  EXPECT_FALSE(attention_sdpa(AttentionImpl::Auto, 0.1, false, 1, false));
  EXPECT_FALSE(attention_sdpa(AttentionImpl::Auto, 0.0, true, 1, true));
  EXPECT_FALSE(attention_sdpa(AttentionImpl::Auto, 0.0, false, 2, false));
  EXPECT_TRUE(attention_sdpa(AttentionImpl::Auto, 0.0, false, 2, true));
  EXPECT_TRUE(attention_sdpa(AttentionImpl::Sdpa, 0.0, false, 1, false));
  EXPECT_FALSE(attention_sdpa(AttentionImpl::Naive, 0.0, false, 1, true));
  EXPECT_FALSE(attention_sdpa(AttentionImpl::Tiled, 0.0, false, 1, false));
  for (auto a : {AttentionImpl::Naive, AttentionImpl::Tiled, AttentionImpl::Auto}) {
    EXPECT_EQ(parse_attention(attention_name(a)), a);
  }
  EXPECT_THROW(parse_attention("flash"), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain::plan
