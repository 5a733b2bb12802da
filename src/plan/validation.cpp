#include "meshtrain/plan/validation.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace meshtrain::plan {

namespace {

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

}  // namespace

std::vector<PublishedRun> published_runs() {
  std::vector<PublishedRun> runs;
  korthikanti(runs);
  narayanan(runs);
  return runs;
}

double narayanan_eq3_flops(const ModelSpec& m, int64_t global_batch) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(m.seq);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

std::string validation_table() {
  std::string out =
      "| source | run | configuration | published | predicted | error |\n|---|---|---|---:|---:|---:|\n";
  std::map<std::string, std::pair<double, int>> worst;  // source: largest |error|, runs within 10%
  std::vector<std::string> order;
  for (const PublishedRun& run : published_runs()) {
    const double p = predict(run), err = p / run.published - 1;
    const bool seconds = run.metric == PublishedRun::Metric::StepSeconds;
    out += fmt::format("| {} | {} | {} on {} x {} | {:.2f} {} | {:.2f} {} | {:+.1f}% |\n", run.source, run.label,
                       run.strategy.describe(), run.strategy.world(), run.gpu, run.published, seconds ? "s" : "TFLOP/s",
                       p, seconds ? "s" : "TFLOP/s", 100 * err);
    if (!worst.count(run.source)) order.push_back(run.source);
    auto& [w, within] = worst[run.source];
    w = std::max(w, std::abs(err));
    within += std::abs(err) <= 0.10;
  }
  out += "\n";
  for (const auto& src : order) {
    int n = 0;
    for (const PublishedRun& run : published_runs()) n += run.source == src;
    out += fmt::format("- {}: {} of {} runs within 10%, largest error {:.1f}%\n", src, worst[src].second, n,
                       100 * worst[src].first);
  }
  return out;
}

double predict(const PublishedRun& run) {
  const ModelSpec& m = preset(run.model);
  const StepEstimate e = estimate_step(m, run.strategy, gpu_preset(run.gpu), run.options);
  if (run.metric == PublishedRun::Metric::StepSeconds) return e.step_s;
  return narayanan_eq3_flops(m, run.strategy.global_batch) / (e.step_s * run.strategy.world()) / 1e12;
}

}  // namespace meshtrain::plan
