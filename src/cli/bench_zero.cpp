// meshtrain bench zero [--nproc N]: step time, per-rank memory and bytes
// moved of DDP and ZeRO-1/2/3 on the same model and data, in the same run.
// Each variant owns the model while it runs (ZeRO rewires the parameters into
// its flat buffers), so every round rebuilds it; rounds rotate the order.
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "cli/bench_data.h"
#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/platform/threads.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/step.h"

namespace meshtrain::cli {
namespace {

struct Measured {
  std::vector<double> times;
  MemoryUse memory;
  int64_t gathered_peak = 0;
  uint64_t wire = 0;  // bytes per rank per step, all collectives of the dp group
};

// Fp32 state per rank by the formula (train/memory.h), for stage 0 = DDP.
double formula(int stage, double psi, double n) {
  switch (stage) {
    case 1: return 8 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    case 3: return 16 * psi / n;
    default: return 16 * psi;
  }
}

}  // namespace

void add_bench_zero(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<TrainBenchOptions>();
  auto cmd = bench->add_subcommand("zero", "DDP vs ZeRO-1/2/3: step time, per-rank memory and bytes moved");
  add_train_bench_options(cmd, *o);
  runs.emplace_back(cmd, [o]() {
    check_train_bench_options(*o);
    if (int rc = relaunch_if_needed(o->nproc); rc >= 0) return rc;
    auto rt = start_runtime(600);
    Comm& dp = rt->world();
    const plan::ModelSpec spec = bench_model(*o);
    Comm solo("solo", rt->rank());
    RandomBatches batches(spec, *o, rt->rank());
    AdamWOptions ao;
    ao.lr = 1e-5;
    Measured m[4];
    int64_t psi = 0;
    for (int r = 0; r < o->rounds; ++r) {
      for (int k = 0; k < 4; ++k) {
        const int stage = (k + r) % 4;
        Transformer model(spec, solo, false, 1);
        psi = model.params().local_numel();
        std::unique_ptr<DataParallel> ddp;
        std::unique_ptr<ShardedDataParallel> zero;
        if (stage == 0) {
          ddp = std::make_unique<DataParallel>(model.params().params(), dp, DdpOptions{});
        } else {
          zero = std::make_unique<ShardedDataParallel>(model, dp, solo, solo, ao, ZeroOptions{stage});
        }
        AdamW opt(zero ? zero->shard_params() : model.params().params(), ao);
        TrainStep step(model, opt, dp, solo, {Precision::Fp32, nullptr, ddp.get(), zero.get()});
        step.run(batches.next());  // warm-up: first-touch of every buffer
        dp.reset_stats();
        for (int i = 0; i < o->steps; ++i) {
          dp.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          step.run(batches.next());
          m[stage].times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        uint64_t wire = 0;
        for (const auto& [op, s] : dp.stats()) wire += op == "barrier" ? 0 : s.wire_bytes;
        m[stage].wire = wire / o->steps;
        m[stage].memory = measure_memory(model.params().params(), opt, ddp.get(), {zero.get()});
        if (zero) m[stage].gathered_peak = zero->peak_gathered_bytes();
      }
    }
    if (rt->rank() == 0) {
      const double n = dp.size();
      fmt::print("{} ({} parameters), {} ranks, micro-batch {} x seq {} per rank, fp32, {} threads per rank; {} rounds "
                 "x {} steps\n",
                 spec.name, psi, dp.size(), o->micro_batch, o->seq, threads_per_rank(dp.size()), o->rounds, o->steps);
      fmt::print("{:<8} {:>9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "variant", "s/step", "vs DDP",
                 "params", "grads", "optimizer", "state", "formula", "gathered", "wire/step");
      auto h = [](double b) { return plan::human_bytes(b); };
      const double ddp_time = median(m[0].times);
      for (int s = 0; s < 4; ++s) {
        const double t = median(m[s].times);
        fmt::print("{:<8} {:>9.3f} {:>7.3f} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
                   s == 0 ? "DDP" : fmt::format("ZeRO-{}", s), t, t / ddp_time, h(m[s].memory.params),
                   h(m[s].memory.grads), h(m[s].memory.optimizer), h(m[s].memory.state()),
                   h(formula(s, static_cast<double>(psi), n)), h(m[s].gathered_peak), h(m[s].wire));
      }
      fmt::print("state = parameters + gradients + Adam moments, measured after a step; DDP's {} of buckets and "
                 "ZeRO-3's gathered layers (peak) come on top\n",
                 h(m[0].memory.buffers));
    }
    return 0;
  });
}

}  // namespace meshtrain::cli
