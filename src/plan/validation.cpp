#include "meshtrain/plan/validation.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "meshtrain/plan/memory.h"

namespace meshtrain::plan {

namespace {

constexpr const char* kTorchtitan = "torchtitan H100 benchmarks, 2024-12";

// Megatron-LM's GPT runs on Selene: tp, pp, dp, interleaving, micro-batch, global batch; fp16 weights.
Strategy megatron(int tp, int pp, int dp, int vpp, int64_t mb, int64_t gb) {
  Strategy s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.vpp = vpp;
  s.schedule = vpp > 1 ? Schedule::Interleaved : Schedule::OneFOneB;
  s.micro_batch = mb, s.global_batch = gb;
  s.precision = Precision::Megatron18;  // fp16 weights, fp32 main gradients
  return s;
}

// Korthikanti et al. 2022 (arXiv 2205.05198) Table 5: iteration time (s) of four GPT models on Selene (DGX
// A100 80 GB, 8 per node), Megatron-LM, fp16, dropout 0.1, materialised attention, vocabulary 51200, seq
// 2048; configs in their Table 3 (tp 8 for all; pp 1 / 8 / 35 / 64; micro-batch 4 / 1 / 1 / 1; global batch
// 4 / 64 / 280 / 512) with the interleaved schedule of 3 virtual stages for 175B and 530B (as Calculon's
// validation inputs, calculon-ai/calculon validation/*.json, reproduce them). Two rows each: full
// recomputation without sequence parallelism, and sequence parallelism + selective recomputation ("present
// work"). Gradients were all-reduced after the backward then (dp is 1 here in any case); the weight-gradient
// GEMMs accumulated into the fp32 main gradients (gradient accumulation fusion).
void korthikanti(std::vector<PublishedRun>& runs) {
  struct Row {
    const char* size;
    int pp, vpp;
    int64_t mb, gb;
    double full_s, present_s;
  };
  const Row rows[] = {{"22b", 1, 1, 4, 4, 1.42, 1.10},
                      {"175b", 8, 3, 1, 64, 18.13, 13.75},
                      {"530b", 35, 3, 1, 280, 49.05, 37.83},
                      {"1t", 64, 1, 1, 512, 94.42, 71.49}};
  for (const auto& r : rows) {
    PublishedRun run;
    run.source = "Korthikanti et al. 2022, Table 5";
    run.model = std::string("korthikanti-") + r.size;
    run.gpu = "a100";
    run.options.time.dp_overlap = false;
    run.strategy = megatron(8, r.pp, 1, r.vpp, r.mb, r.gb);
    run.strategy.recompute = Recompute::Full;
    run.label = std::string(r.size) + ", full recomputation";
    run.published = r.full_s;
    runs.push_back(run);
    run.strategy.sp = true;
    run.strategy.recompute = Recompute::Selective;
    run.label = std::string(r.size) + ", sequence parallel + selective";
    run.published = r.present_s;
    runs.push_back(run);
  }
}

// Narayanan et al. 2021 (arXiv 2104.04473) Table 1: achieved teraFLOP/s per GPU of the weak-scaling series
// (1.7B to 1T) on Selene, counted with their Eq. 3. Each row's micro-batch, interleaving and data-parallel
// implementation are those of the paper's own scripts (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh and
// CONFIG.sh): fp16 with gradients accumulated and all-reduced in fp16 (no --accumulate-allreduce-grads-in-fp32),
// no gradient accumulation fusion (Megatron-LM commit 83b1e42f30, February 2022), no asynchronous tp
// all-reduce in the backward (ColumnParallelLinearWithAsyncAllreduce came in September 2021: the scripts'
// commit de7dc40f88 of August 2021 has none, and the paper's runs are older), "torch" DDP for the rows
// without a pipeline (its all-reduce overlaps the last micro-batch's backward), "local" DDP after the
// backward for the others, full recomputation ("--recompute-method uniform"), scatter/gather pipeline sends
// (their sec. 4.1), no sequence parallelism (it came a year later).
void narayanan(std::vector<PublishedRun>& runs) {
  struct Row {
    const char* size;
    int tp, pp, vpp, gpus;  // vpp: layers per stage over --num-layers-per-virtual-pipeline-stage
    int64_t mb, gb;
    double tflops;
  };
  const Row rows[] = {{"1.7b", 1, 1, 1, 32, 16, 512, 137},    {"3.6b", 2, 1, 1, 64, 16, 512, 138},
                      {"7.5b", 4, 1, 1, 128, 16, 512, 142},   {"18b", 8, 1, 1, 256, 8, 1024, 135},
                      {"39b", 8, 2, 1, 512, 4, 1536, 138},    {"76b", 8, 4, 3, 1024, 2, 1792, 140},
                      {"145b", 8, 8, 2, 1536, 2, 2304, 148},  {"310b", 8, 16, 2, 1920, 1, 2160, 155},
                      {"530b", 8, 35, 3, 2520, 1, 2520, 163}, {"1t", 8, 64, 1, 3072, 1, 3072, 163}};
  for (const auto& r : rows) {
    PublishedRun run;
    run.source = "Narayanan et al. 2021, Table 1";
    run.label = r.size;
    run.model = std::string("megatron-") + r.size;
    run.gpu = "a100";
    run.strategy = megatron(r.tp, r.pp, r.gpus / (r.tp * r.pp), r.vpp, r.mb, r.gb);
    run.strategy.precision = Precision::Bf16;  // 16-bit weights and gradients, fp32 master and moments
    run.strategy.recompute = Recompute::Full;
    run.options.time.dp_overlap = r.pp == 1;
    run.options.time.grad_accumulation_fusion = false;
    run.options.time.tp_overlap_backward = false;
    run.options.time.fp32_grad_reduce = false;
    run.metric = PublishedRun::Metric::TflopsPerGpu;
    run.published = r.tflops;
    runs.push_back(run);
  }
}

// A run of a newer table: `gpus` over tp x pp x cp, dp the rest; unstated fields searched (predict()).
PublishedRun layout_run(const char* source, std::string label, const char* model, const char* gpu, int gpus, int tp,
                        int pp, int cp, int vpp, int64_t mb, int64_t gb, int64_t seq, Precision p, double published) {
  PublishedRun run;
  run.source = source, run.label = std::move(label), run.model = model, run.gpu = gpu;
  Strategy& s = run.strategy;
  s.tp = tp, s.pp = pp, s.cp = cp, s.dp = gpus / (tp * pp * cp), s.vpp = vpp;
  s.sp = tp > 1;
  s.flash = true;
  s.schedule = vpp > 1 ? Schedule::Interleaved : Schedule::OneFOneB;
  s.micro_batch = mb, s.global_batch = gb, s.seq = seq, s.precision = p;
  run.metric = PublishedRun::Metric::TokensPerSecondPerGpu;
  run.published = published;
  return run;
}

// Megatron-LM's split where the layers alone do not divide the pp x v stages: the embedding and the loss count as
// a layer each (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split), so the first and
// the last stage hold one layer fewer. Empty where the layers divide (the even split) or this does not either.
std::vector<int64_t> megatron_split(int64_t layers, int stages) {
  if (layers % stages == 0 || (layers + 2) % stages != 0 || (layers + 2) / stages < 2) return {};
  std::vector<int64_t> out(stages, (layers + 2) / stages);
  out.front() -= 1, out.back() -= 1;
  return out;
}

// NVIDIA NeMo 24.07's pretraining table (NVIDIA/NeMo docs/source/performance/performance_summary.md): DGX-H100,
// FP8, Megatron-Core under NeMo, tokens/s per GPU. The table gives the layout; the switches it leaves out are those
// of NeMo-Framework-Launcher's recommended H100 FP8 runs at tag 24.07 (examples/training/{gpt,llama}/h100/*_fp8.sh
// and the launcher_scripts/conf/training/ configs they load; the examples README: "a recommended config for GPT,
// LLAMA2, Nemotron pretraining"): no recomputation (activations_checkpoint_granularity null), the distributed
// optimizer (distributed_fused_adam: ZeRO-1) with overlap_grad_sync and overlap_param_sync, gradients reduced in
// bf16 (optim.grad_sync_dtype=bf16), sequence parallelism with tp, and Transformer Engine's tp communication
// overlap (ub_tp_comm_overlap) where the model's config sets it: llama2_70b and llama3_70b, not gpt3/175b. Where
// an example's layout differs from the table's row (175B's VP 12 against the table's 6, 13B's one node against
// 16 GPUs) the table's stands. Rows entered on 2026-12-06 with ZeRO and recomputation searched; the launcher's
// switches entered on 2026-12-07, for every row of both halves alike.
void nemo_2407(std::vector<PublishedRun>& runs) {
  const char* src = "NeMo 24.07 performance summary, DGX-H100 FP8";
  struct Row {
    const char* label; const char* model; int gpus; int64_t gb, mb, seq; int tp, pp, cp, vpp; bool tp_overlap;
    double tokens;
  };
  const Row rows[] = {{"GPT3-175B, 128 GPUs", "gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, false, 726},
                      {"GPT3-175B, 512 GPUs", "gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, false, 782},
                      {"LLAMA2-7B", "llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, false, 16847},
                      {"LLAMA2-13B", "llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, false, 8646},
                      {"LLAMA2-70B", "llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, true, 1707},
                      {"LLAMA3-8B", "llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, false, 12036},
                      {"LLAMA3-70B", "llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, true, 1533}};
  for (const Row& r : rows) {
    PublishedRun run = layout_run(src, r.label, r.model, "h100", r.gpus, r.tp, r.pp, r.cp, r.vpp, r.mb, r.gb, r.seq,
                                  Precision::Fp8, r.tokens);
    run.strategy.zero = 1;
    run.strategy.recompute = Recompute::None;
    run.options.time.param_gather_overlap = true;
    run.options.time.fp32_grad_reduce = false;
    run.options.time.tp_overlap = r.tp_overlap;
    run.notes = fmt::format("NeMo 24.07 container; NeMo-Framework-Launcher 24.07's H100 FP8 switches: ZeRO-1 with "
                            "overlapped reduce and gather, bf16 gradient reduction, no recomputation{}",
                            r.tp_overlap ? ", tp communication overlap" : "");
    runs.push_back(run);
  }
}

// Megatron-Bridge's pretraining tables (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, the 25.11
// container; docs/performance-summary-archive.md, the 26.02 container), FP8 current scaling, tokens/s per GPU.
// FSDP 1 is Megatron-FSDP (ZeRO-3). The table gives the layout; the switches are its performance recipes' ("These
// results were obtained using performance recipes"): scripts/performance/configs/llama3{,1}/ at v0.2.1 (25.11) and
// configs/llama/ at v0.3.0 (26.02), over src/megatron/bridge/recipes/llama/llama3.py: the distributed optimizer
// (use_distributed_optimizer: ZeRO-1 where FSDP is 0) with overlap_grad_reduce and overlap_param_gather, gradients
// reduced in bf16 (grad_reduce_in_fp32 = False), Transformer Engine's tp communication overlap wherever tp > 1 (the
// 70B and 405B recipes' tp_comm_overlap with their userbuffers configs), no recomputation except the 8B H100 FP8
// preset's recompute_num_layers = 5 (full recomputation of 5 layers of 32: not a planner setting, so that row's
// recomputation is searched). The layer split of 405B's 126 layers over pp x v is Megatron's (megatron_split()).
// Rows entered on 2026-12-06 with ZeRO and recomputation searched; the recipes' switches entered on 2026-12-07, for
// every row of both halves alike.
void megatron_bridge(std::vector<PublishedRun>& runs) {
  struct Row {
    const char* source; const char* label; const char* model; const char* gpu; int gpus; int64_t gb, mb;
    int fsdp, tp, pp, cp, vpp; bool partial_recompute; double tokens;
  };
  const char* b2511 = "Megatron-Bridge 25.11 performance summary, FP8-CS";
  const char* b2602 = "Megatron-Bridge 26.02 performance summary, FP8";
  const Row rows[] = {{b2511, "LLAMA3_8B, DGX-H100", "llama3-8b", "h100", 8, 128, 1, 1, 1, 1, 1, 1, true, 14451},
                      {b2511, "LLAMA3_70B, DGX-H100", "llama3-70b", "h100", 64, 128, 1, 0, 4, 8, 1, 5, false, 1602},
                      {b2511, "LLAMA3.1_405B, DGX-H100", "llama3-405b", "h100", 1024, 512, 1, 0, 8, 8, 2, 8, false, 292},
                      {b2511, "LLAMA3_8B, DGX-B200", "llama3-8b", "b200", 8, 128, 2, 0, 1, 1, 1, 1, false, 30624},
                      {b2511, "LLAMA3.1_405B, DGX-B200", "llama3-405b", "b200", 128, 64, 1, 0, 4, 8, 2, 8, false, 661},
                      {b2602, "LLAMA3_70B, DGX-H100", "llama3-70b", "h100", 64, 256, 1, 0, 4, 8, 1, 5, false, 1621},
                      {b2602, "LLAMA3.1_405B, DGX-H100", "llama3-405b", "h100", 1024, 1536, 1, 0, 8, 8, 2, 8, false, 311}};
  for (const Row& r : rows) {
    PublishedRun run = layout_run(r.source, r.label, r.model, r.gpu, r.gpus, r.tp, r.pp, r.cp, r.vpp, r.mb, r.gb,
                                  8192, Precision::Fp8, r.tokens);
    run.strategy.pp_layers = megatron_split(preset(r.model).layers, r.pp * r.vpp);
    run.strategy.zero = r.fsdp ? 3 : 1;
    run.strategy.recompute = Recompute::None;
    run.unstated.recompute = r.partial_recompute;
    run.options.time.param_gather_overlap = true;
    run.options.time.fp32_grad_reduce = false;
    run.options.time.tp_overlap = r.tp > 1;
    run.notes = fmt::format("the performance recipe's switches: {}, bf16 gradient reduction{}{}",
                            r.fsdp ? "Megatron-FSDP" : "the distributed optimizer (ZeRO-1) with overlapped reduce and gather",
                            r.tp > 1 ? ", tp communication overlap" : "",
                            r.partial_recompute ? "; 5 of 32 layers recomputed (not modelled: recomputation searched)"
                                                : ", no recomputation");
    if (!run.strategy.pp_layers.empty()) run.notes += "; 126 layers split as Megatron's embedding/loss accounting";
    runs.push_back(run);
  }
}

// torchtitan's benchmarks (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, torch of 2024-12-23):
// Grand Teton hosts, H100 with 96 GB HBM2e at 2.4 TB/s and a 500 W limit (its peak FLOP/s unknown: "between SXM
// and NVL"; the preset's SXM peak stands), 400 Gb/s per GPU; TPS/GPU at iteration 90. Tables 1 and 3 (Llama 3.1
// 8B, FSDP, eager bf16, selective activation checkpointing, local batch 2) and Table 4 (70B, FSDP 32 x TP 8,
// torch.compile + Float8, full checkpointing, local batch 16; with and without async TP). The sequence length is
// unstated for these tables: torchtitan's llama3 configs' 8192 (train_configs/llama3_8b.toml, with
// selective_ac_option = "op"). The 500 W limit's clocks: fitted (torchtitan_clock_scale, below). Not modelled:
// torch.compile's fusions. Table 5's
// 405B runs are left out: FSDP with pipeline parallelism is a layout the planner refuses (ZeRO-2/3 with pp).
void torchtitan(std::vector<PublishedRun>& runs) {
  const char* src = kTorchtitan;
  struct Row {
    const char* label; const char* model; int gpus, tp; int64_t gb; Precision p; Recompute rc; bool async_tp;
    double tokens;
  };
  const Row rows[] = {{"8B, FSDP, 8 GPUs (Table 1)", "llama3-8b", 8, 1, 16, Precision::Bf16, Recompute::Selective, false, 5762},
                      {"8B, FSDP, 128 GPUs (Table 3)", "llama3-8b", 128, 1, 256, Precision::Bf16, Recompute::Selective, false, 5605},
                      {"70B, FSDP 32 x TP 8 (Table 4)", "llama3-70b", 256, 8, 512, Precision::Fp8, Recompute::Full, false, 829},
                      {"70B, FSDP 32 x TP 8, async TP (Table 4)", "llama3-70b", 256, 8, 512, Precision::Fp8, Recompute::Full, true, 876}};
  for (const Row& r : rows) {
    const int dp = r.gpus / r.tp;
    PublishedRun run = layout_run(src, r.label, r.model, "h100", r.gpus, r.tp, 1, 1, 1, r.gb / dp, r.gb, 8192, r.p,
                                  r.tokens);
    run.strategy.zero = 3;
    run.strategy.recompute = r.rc;
    run.options.time.tp_overlap = r.async_tp;
    // Tables 1 and 3 ran eager (their torch.compile rows are others) with the llama3_8b config's
    // selective_ac_option = "op": per-op checkpointing and unfused elementwise ops (step_time.h).
    const bool eager = r.rc == Recompute::Selective;
    run.strategy.sac_op = eager;
    run.options.time.eager_elementwise = eager;
    run.memory_bytes = 96e9, run.memory_bw = 2.4e12;
    run.notes = eager ? "H100 96 GB HBM2e, 500 W; sequence 8192 (the configs'); eager, per-op selective checkpointing"
                      : "H100 96 GB HBM2e, 500 W; sequence 8192 (the configs'); torch.compile's fusions not modelled";
    runs.push_back(run);
  }
}

// Llama 3 (Dubey et al. 2024, arXiv 2407.21783) Table 4: the 405B pretraining layouts on H100 80 GB (700 W,
// HBM3), 400 Gb/s RoCE per GPU, BF16; TFLOP/s per GPU as the paper counts them (their FLOP count is not spelled
// out: the planner's, the whole attention square, PaLM's convention). Data parallelism is FSDP; context
// parallelism all-gathers K and V (their sec. 3.3.2). Recomputation: none at sequence 8192 (sec. 3.3.2: "we could
// pre-train Llama 3 on sequences of 8K tokens without activation checkpointing", after deallocating each stage's
// input and output tensors; this row field was first entered as unstated, corrected on 2026-12-07), unstated at
// 131072. The schedule is interleaved (sec. 3.3.2), V unstated. Unstated: the micro-batch, the virtual stages, the
// FSDP resharding (ZeRO searched).
void llama3(std::vector<PublishedRun>& runs) {
  const char* src = "Dubey et al. 2024 (Llama 3), Table 4";
  struct Row { int gpus, cp, dp; int64_t seq, per_dp; double tflops; };
  const Row rows[] = {{8192, 1, 64, 8192, 32, 430}, {16384, 1, 128, 8192, 16, 400}, {16384, 16, 8, 131072, 16, 380}};
  for (const Row& r : rows) {
    PublishedRun run = layout_run(src, fmt::format("405B, {} GPUs, cp {}, seq {}", r.gpus, r.cp, r.seq), "llama3-405b",
                                  "h100", r.gpus, 8, 16, r.cp, 1, 1, r.per_dp * r.dp, r.seq, Precision::Bf16, r.tflops);
    run.strategy.cp_impl = CpImpl::AllGather;
    run.metric = PublishedRun::Metric::ModelTflopsPerGpu;
    run.unstated.zero = run.unstated.micro_batch = run.unstated.vpp = true;
    run.strategy.schedule = Schedule::Interleaved;  // sec. 3.3.2: interleaved, "V pipeline stages on one pipeline rank"
    run.unstated.recompute = r.seq != 8192;
    run.strategy.recompute = Recompute::None;
    run.notes = run.unstated.recompute ? "micro-batch, virtual stages, recomputation and ZeRO unstated (searched)"
                                       : "no recomputation (sec. 3.3.2); micro-batch, virtual stages and ZeRO unstated "
                                         "(searched)";
    runs.push_back(run);
  }
}

thread_local int fitting_scopes = 0;

}  // namespace

FittingScope::FittingScope() { ++fitting_scopes; }
FittingScope::~FittingScope() { --fitting_scopes; }

namespace {

// The newer list in its order, each row's half set by its place (the split of 2026-12-06: odd rows held out), at
// the presets' clocks.
std::vector<PublishedRun> unscaled_newer_runs() {
  std::vector<PublishedRun> runs;
  nemo_2407(runs);
  megatron_bridge(runs);
  torchtitan(runs);
  llama3(runs);
  for (size_t i = 0; i < runs.size(); ++i) runs[i].half = i % 2 ? PublishedRun::Half::HeldOut : PublishedRun::Half::Fitting;
  return runs;
}

// torchtitan's H100s run at a 500 W limit with a peak "between SXM and NVL" (its benchmark page, footnote 2): the
// interval's ends are the data sheets' dense bf16 peaks, NVL 835 against SXM 989 TFLOP/s (FP8 1670.5 against 1979:
// the same 0.844). Where in it is not published, so it is fitted, on 2026-12-07, on the source's fitting rows only
// (fit_clock_scale: the smallest largest |error|), once; the held-out rows take the fitted value.
double torchtitan_clock_scale() {
  static const double scale = [] {
    std::vector<PublishedRun> fitting;
    for (PublishedRun& r : unscaled_newer_runs())
      if (r.source == kTorchtitan && r.half == PublishedRun::Half::Fitting) fitting.push_back(std::move(r));
    return fit_clock_scale(fitting, 835.0 / 989.0, 1.0);
  }();
  return scale;
}

std::vector<PublishedRun> newer_runs() {
  std::vector<PublishedRun> runs = unscaled_newer_runs();
  for (PublishedRun& r : runs) {
    if (r.source != kTorchtitan) continue;
    r.clock_scale = torchtitan_clock_scale();
    r.notes += fmt::format("; tensor cores at {:.3f} of SXM's peak (fitted on this source's fitting rows within "
                           "its [NVL, SXM])",
                           r.clock_scale);
  }
  return runs;
}

}  // namespace

std::vector<PublishedRun> fitting_runs() {
  std::vector<PublishedRun> runs;
  korthikanti(runs);
  narayanan(runs);
  for (PublishedRun& r : newer_runs())
    if (r.half == PublishedRun::Half::Fitting) runs.push_back(std::move(r));
  return runs;
}

std::vector<PublishedRun> held_out_runs() {
  if (fitting_scopes > 0) {
    throw std::logic_error("a held-out published run was read inside a FittingScope: the model may be shaped on the "
                           "fitting half only (plan/validation.h)");
  }
  std::vector<PublishedRun> runs;
  for (PublishedRun& r : newer_runs())
    if (r.half == PublishedRun::Half::HeldOut) runs.push_back(std::move(r));
  return runs;
}

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> runs = fitting_runs();
  for (PublishedRun& r : held_out_runs()) runs.push_back(std::move(r));
  return runs;
}

double narayanan_eq3_flops(const ModelSpec& m, int64_t global_batch) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char* unit(PublishedRun::Metric m) {
  switch (m) {
    case PublishedRun::Metric::StepSeconds: return "s";
    case PublishedRun::Metric::TflopsPerGpu: return "TFLOP/s";
    case PublishedRun::Metric::TokensPerSecondPerGpu: return "tok/s";
    case PublishedRun::Metric::ModelTflopsPerGpu: return "TFLOP/s";
  }
  return "";
}

std::string half_table(const char* title, const std::vector<PublishedRun>& runs) {
  std::string out = fmt::format("### {}\n\n| source | run | configuration predicted | published | predicted | error |\n"
                                "|---|---|---|---:|---:|---:|\n",
                                title);
  std::map<std::string, double> worst;  // source: largest |error|
  std::vector<std::string> order;
  std::vector<double> errors;
  for (const PublishedRun& run : runs) {
    const Prediction p = predict_run(run);
    const double err = p.value / run.published - 1;
    out += fmt::format("| {} | {} | {} on {} x {}{} | {:.2f} {} | {:.2f} {} | {:+.1f}% |\n", run.source, run.label,
                       p.strategy.describe(), p.strategy.world(), run.gpu, p.fits ? "" : " (does not fit)",
                       run.published, unit(run.metric), p.value, unit(run.metric), 100 * err);
    if (!worst.count(run.source)) order.push_back(run.source);
    worst[run.source] = std::max(worst[run.source], std::abs(err));
    errors.push_back(std::abs(err));
  }
  const int within = static_cast<int>(std::count_if(errors.begin(), errors.end(), [](double e) { return e <= 0.10; }));
  out += fmt::format("\n{}: {} runs, median |error| {:.1f}%, largest {:.1f}%, {} within 10%\n\n", title, runs.size(),
                     100 * median(errors), 100 * *std::max_element(errors.begin(), errors.end()), within);
  for (const std::string& src : order) {
    const auto n = std::count_if(runs.begin(), runs.end(), [&](const PublishedRun& r) { return r.source == src; });
    out += fmt::format("- {}: {} run{}, largest error {:.1f}%\n", src, n, n == 1 ? "" : "s", 100 * worst[src]);
  }
  return out;
}

}  // namespace

std::string validation_table() {
  std::string out = half_table("Fitting half", fitting_runs()) + "\n" + half_table("Held-out half", held_out_runs());
  out += "\n### Fine-tuning, held out (meshtrain plan --method, plan/posttrain_search.h)\n\n" + post_training_table();
  out += "\nNotes on the newer rows (what each source leaves unstated is searched: the fastest setting that fits):\n";
  for (const PublishedRun& run : published_runs()) {
    if (!run.notes.empty()) out += fmt::format("- {}, {}: {}\n", run.source, run.label, run.notes);
  }
  return out;
}

Prediction predict_run(const PublishedRun& run) {
  const ModelSpec& m = preset(run.model);
  GpuSpec gpu = gpu_preset(run.gpu);
  if (run.memory_bytes > 0) gpu.memory_bytes = run.memory_bytes;
  if (run.memory_bw > 0) gpu.memory_bw = run.memory_bw;
  if (run.clock_scale != 1) {
    gpu.peak_flops *= run.clock_scale, gpu.fp8_peak_flops *= run.clock_scale;
    for (std::vector<double>* rates : {&gpu.flash_d64, &gpu.flash_d128})
      for (double& r : *rates) r *= run.clock_scale;
  }
  const PublishedRun::Unstated& u = run.unstated;
  const Strategy& given = run.strategy;
  auto values = [](bool searched, auto stated, auto all) { return searched ? all : decltype(all){stated}; };
  Prediction best;
  double best_s = INFINITY;
  Strategy fastest;  // the fastest valid setting, whether it fits or not
  double fastest_s = INFINITY;
  for (int zero : values(u.zero, given.zero, std::vector<int>{0, 1, 2, 3}))
    for (Recompute rc : values(u.recompute, given.recompute,
                               std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full}))
      for (int64_t mb : values(u.micro_batch, given.micro_batch, std::vector<int64_t>{1, 2, 4, 8}))
        for (int v : values(u.vpp, given.vpp, std::vector<int>{1, 2, 4})) {
          Strategy s = given;
          s.zero = zero, s.recompute = rc, s.micro_batch = mb, s.vpp = v;
          if (u.vpp && given.schedule == Schedule::Interleaved && v == 1) continue;  // interleaved, V unstated
          if (u.vpp) {
            s.schedule = v > 1 ? Schedule::Interleaved : Schedule::OneFOneB;
            s.pp_layers = v > 1 ? megatron_split(m.layers, s.pp * v) : std::vector<int64_t>{};
          }
          try {
            validate(s, m);
          } catch (const std::invalid_argument&) {
            continue;
          }
          const double step = estimate_step(m, s, gpu, run.options).step_s;
          if (step < fastest_s) fastest_s = step, fastest = s;
          if (memory_ledger(m, s).peak().device_total() > gpu.memory_bytes) continue;
          if (step < best_s) best_s = step, best.strategy = s;
        }
  if (!std::isfinite(best_s)) {  // nothing fits by the ledger: the fastest valid setting (else as stated), flagged
    best.fits = false;
    best.strategy = std::isfinite(fastest_s) ? fastest : given;
    best_s = std::isfinite(fastest_s) ? fastest_s : estimate_step(m, given, gpu, run.options).step_s;
  }
  const Strategy& s = best.strategy;
  const double tokens = static_cast<double>(s.global_batch) * (s.seq > 0 ? s.seq : m.seq);
  switch (run.metric) {
    case PublishedRun::Metric::StepSeconds: best.value = best_s; break;
    case PublishedRun::Metric::TflopsPerGpu:
      best.value = narayanan_eq3_flops(m, s.global_batch) / (best_s * s.world()) / 1e12;
      break;
    case PublishedRun::Metric::TokensPerSecondPerGpu: best.value = tokens / (best_s * s.world()); break;
    case PublishedRun::Metric::ModelTflopsPerGpu:
      best.value = train_flops_per_token(m, s.seq > 0 ? s.seq : m.seq) * tokens / (best_s * s.world()) / 1e12;
      break;
  }
  return best;
}

double predict(const PublishedRun& run) { return predict_run(run).value; }

double fit_clock_scale(const std::vector<PublishedRun>& rows, double lo, double hi) {
  if (rows.empty()) throw std::invalid_argument("fit_clock_scale: no rows to fit on");
  for (const PublishedRun& r : rows) {
    if (r.half != PublishedRun::Half::Fitting) {
      throw std::invalid_argument(fmt::format("fit_clock_scale: {}, {} is held out; fit on the fitting half only",
                                              r.source, r.label));
    }
  }
  const int steps = static_cast<int>(std::lround((hi - lo) / 0.001));
  double best = hi, best_worst = INFINITY;
  for (int i = 0; i <= steps; ++i) {
    const double scale = hi - i * (hi - lo) / std::max(steps, 1);
    double worst = 0;
    for (PublishedRun r : rows) {
      r.clock_scale = scale;
      worst = std::max(worst, std::abs(predict(r) / r.published - 1));
    }
    if (worst < best_worst) best_worst = worst, best = scale;
  }
  return best;
}

// NVIDIA NeMo 24.07's fine-tuning table (NVIDIA/NeMo docs/source/performance/performance_summary.md): DGX-H100,
// FP8, SQuAD v1.1 packed to 4096 tokens, global batch 32, micro-batch 1, tokens/s per GPU. The SFT rows' switches are
// those of NeMo-Framework-Launcher's H100 examples at tag 24.07 (examples/peft/llama/h100/{7b_1node,13b_1node,
// 70b_2node}.sh over launcher_scripts/conf/peft/llama/sft.yaml), entered on 2026-12-07: no recomputation
// (activations_checkpoint_granularity null); distributed_fused_adam (ZeRO-1) with overlap_param_sync, bf16
// gradient reduction (grad_sync_dtype) and bf16 optimizer states (optim.dtype, with Apex's default store_params:
// Strategy::bf16_optimizer); FP8 weights (fp8_params: Strategy::fp8_params); the scripts' virtual stages (13B 10,
// 70B 20: the table has no VP column); for 70B sequence parallelism with ub_tp_comm_overlap. The LoRA rows keep their
// searched switches (their scripts' fused_adam is not distributed; 70B's ub_tp_comm_overlap comes without
// sequence_parallel, sft.yaml's default, and is not modelled). Unstated: the adapters' rank and targets (the
// planner's rank 8 on q and v: the frozen base's passes dominate the step either way).
std::vector<PublishedPostTrainRun> post_training_runs() {
  if (fitting_scopes > 0) {
    throw std::logic_error("a held-out published fine-tuning run was read inside a FittingScope (plan/validation.h)");
  }
  struct Row { const char* label; PostTrainMethod method; const char* model; int gpus, tp, pp, vpp; double tokens; };
  const Row rows[] = {{"LLAMA2-7B SFT", PostTrainMethod::Sft, "llama2-7b", 8, 1, 1, 1, 17120},
                      {"LLAMA2-13B SFT", PostTrainMethod::Sft, "llama2-13b", 8, 1, 4, 10, 9741},
                      {"LLAMA2-70B SFT", PostTrainMethod::Sft, "llama2-70b", 16, 4, 4, 20, 1833},
                      {"LLAMA2-7B LoRA", PostTrainMethod::Lora, "llama2-7b", 8, 1, 1, 1, 25206},
                      {"LLAMA2-13B LoRA", PostTrainMethod::Lora, "llama2-13b", 8, 1, 1, 1, 14161},
                      {"LLAMA2-70B LoRA", PostTrainMethod::Lora, "llama2-70b", 8, 2, 4, 1, 2557}};
  std::vector<PublishedPostTrainRun> runs;
  for (const Row& r : rows) {
    PublishedPostTrainRun run;
    run.source = "NeMo 24.07 performance summary, fine-tuning, DGX-H100 FP8";
    run.label = r.label;
    PostTrainInput& in = run.input;
    in.method = r.method;
    in.search.model = preset(r.model);
    in.search.gpu = gpu_preset("h100");
    in.search.gpus = r.gpus;
    in.search.seq = 4096;
    in.search.global_batch = 32;
    in.search.precision = Precision::Fp8;
    in.search.fixed.tp = r.tp, in.search.fixed.pp = r.pp, in.search.fixed.micro_batch = 1;
    if (r.method == PostTrainMethod::Sft) {
      in.search.fixed.zero = 1;
      in.search.fixed.recompute = Recompute::None;
      in.search.fixed.bf16_optimizer = in.search.fixed.fp8_params = true;
      if (r.vpp > 1) in.search.fixed.vpp = r.vpp;
      in.search.estimate.time.param_gather_overlap = true;
      in.search.estimate.time.fp32_grad_reduce = false;
      in.search.estimate.time.tp_overlap = r.tp > 1;
    }
    run.tokens_per_s_per_gpu = r.tokens;
    runs.push_back(run);
  }
  return runs;
}

PostTrainPrediction predict_post_training(const PublishedPostTrainRun& run) {
  const PostTrainResult r = search_post_training(run.input);
  PostTrainPrediction p;
  const auto& c = r.ranked.empty() ? r.leanest : std::optional<PostTrainCandidate>(r.ranked.front());
  if (!c) throw std::invalid_argument(fmt::format("{}: no valid layout", run.label));
  p.fits = !r.ranked.empty();
  p.strategy = c->strategy;
  const SearchInput& in = run.input.search;
  p.tokens_per_s_per_gpu = static_cast<double>(in.global_batch) * in.seq / (c->step_s * in.gpus);
  return p;
}

std::string post_training_table() {
  std::string out = "| source | run | configuration predicted | published | predicted | error |\n|---|---|---|---:|---:|---:|\n";
  std::vector<double> errors;
  for (const PublishedPostTrainRun& run : post_training_runs()) {
    const PostTrainPrediction p = predict_post_training(run);
    const double err = p.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu - 1;
    errors.push_back(std::abs(err));
    out += fmt::format("| {} | {} | {} on {} x {}{} | {:.0f} tok/s | {:.0f} tok/s | {:+.1f}% |\n", run.source, run.label,
                       p.strategy.describe(), run.input.search.gpus, run.input.search.gpu.name,
                       p.fits ? "" : " (does not fit)", run.tokens_per_s_per_gpu, p.tokens_per_s_per_gpu, 100 * err);
  }
  out += fmt::format("\nFine-tuning rows (all held out): {} runs, median |error| {:.1f}%, largest {:.1f}%\n", errors.size(),
                     100 * median(errors), 100 * *std::max_element(errors.begin(), errors.end()));
  return out;
}

}  // namespace meshtrain::plan
