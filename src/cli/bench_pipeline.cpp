// meshtrain bench pipeline [--nproc P]: one training step's forward and
// backward under each pipeline schedule on the same model, on P ranks: step
// time, the bubble the schedule checker predicts, and the bubble measured
// (time each rank waited in receives / step time).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/pipeline/executor.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::cli {

void add_bench_pipeline(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  struct Opts {
    std::string model = "gpt2-124m";
    int64_t micro_batch = 1, seq = 128;
    int micro = 0, steps = 3, nproc = 2, layers = 0;
    std::string balance = "parameters";
  };
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("pipeline", "pipeline schedules: step time, predicted and measured bubble");
  cmd->add_option("--model", o->model, "model preset")->capture_default_str();
  cmd->add_option("--layers", o->layers, "override the preset's layers");
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per micro-batch")->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->capture_default_str();
  cmd->add_option("--microbatches", o->micro, "micro-batches per step (default 4 x ranks)");
  cmd->add_option("--steps", o->steps, "timed steps per schedule")->capture_default_str();
  cmd->add_option("--nproc", o->nproc, "pipeline ranks to start on this machine")->capture_default_str();
  cmd->add_option("--balance", o->balance, "stage balance: parameters | compute")->capture_default_str();
  runs.emplace_back(cmd, [o]() {
    if (o->micro_batch < 1 || o->seq < 1 || o->steps < 1 || o->micro < 0) {
      throw std::invalid_argument("--micro-batch, --seq and --steps must be positive");
    }
    if (o->balance != "parameters" && o->balance != "compute") {
      throw std::invalid_argument(fmt::format("--balance '{}' must be parameters or compute", o->balance));
    }
    const plan::Balance balance = o->balance == "compute" ? plan::Balance::Compute : plan::Balance::Parameters;
    if (int rc = relaunch_if_needed(o->nproc); rc >= 0) return rc;
    auto rt = start_runtime(600);
    Comm& pp = rt->world();
    const int P = pp.size(), M = o->micro > 0 ? o->micro : 4 * P;
    plan::ModelSpec spec = plan::preset(o->model);
    spec.dropout = 0;
    spec.seq = std::max(spec.seq, o->seq);
    if (o->layers > 0) spec.layers = o->layers;
    Comm solo("solo", rt->rank());
    std::unique_ptr<Comm> embed;
    if (spec.tied && P > 1 && (rt->rank() == 0 || rt->rank() == P - 1)) embed = rt->new_group({0, P - 1}, "embed");
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    std::vector<Batch> micro;
    for (int i = 0; i < M; ++i) {
      at::Tensor d = at::randint(spec.vocab, {o->micro_batch, o->seq + 1}, gen, at::kLong);
      micro.push_back({d.narrow(1, 0, o->seq).contiguous(), d.narrow(1, 1, o->seq).contiguous(), {}, {}});
    }
    const double tokens = static_cast<double>(M * o->micro_batch * o->seq);
    struct Variant {
      plan::Schedule kind;
      int v;
    };
    std::vector<Variant> variants{{plan::Schedule::GPipe, 1}, {plan::Schedule::OneFOneB, 1}};
    if (P > 1 && M % P == 0 && spec.layers >= 2 * P) variants.push_back({plan::Schedule::Interleaved, 2});
    variants.push_back({plan::Schedule::ZBH1, 1});
    if (rt->rank() == 0) {
      fmt::print("{} ({} layers), {} pipeline ranks, {} micro-batches of {} x {}, stages balanced by {}; {} timed "
                 "steps each\n",
                 spec.name, spec.layers, P, M, o->micro_batch, o->seq, o->balance, o->steps);
      fmt::print("{:<14} {:>12} {:>18} {:>26}\n", "schedule", "step s", "predicted bubble", "measured wait (max rank)");
    }
    for (const Variant& var : variants) {
      auto chunks = build_stages(spec, solo, false, 1, rt->rank(), P, var.v, {}, balance);
      std::vector<Transformer*> raw;
      for (auto& c : chunks) raw.push_back(c.get());
      const plan::PipelineSchedule sched = plan::build_schedule(var.kind, P, M, var.v);
      // Predicted with this model's stage costs: forward 1, backward 2 per stage.
      const double predicted = plan::simulate(sched).bubble_fraction;
      PipelineExecutor exec(sched, raw, pp, {o->seq, o->micro_batch, spec.hidden}, embed.get());
      exec.run(micro, tokens);  // warm-up
      std::vector<double> step_s, wait;
      for (int i = 0; i < o->steps; ++i) {
        for (Transformer* c : raw)
          for (auto& p : c->params().params()) p.tensor.mutable_grad() = at::Tensor();
        pp.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        exec.run(micro, tokens);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        at::Tensor w = at::tensor({exec.last_wait_seconds() / s}, at::kDouble);
        pp.all_reduce(w, ReduceOp::Max);
        step_s.push_back(s);
        wait.push_back(w.item<double>());
      }
      if (rt->rank() == 0) {
        fmt::print("{:<14} {:>12.3f} {:>17.1f}% {:>25.1f}%\n",
                   fmt::format("{}{}", plan::to_string(var.kind), var.v > 1 ? fmt::format(" v={}", var.v) : ""),
                   median(step_s), 100 * predicted, 100 * median(wait));
      }
    }
    return 0;
  });
}

}  // namespace meshtrain::cli
