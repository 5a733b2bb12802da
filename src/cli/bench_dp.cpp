// meshtrain bench dp [--nproc N]: data-parallel training steps on N ranks
// with the gradients reduced three ways, interleaved in the same run on the
// same model: DDP buckets overlapped with backward, the same buckets reduced
// after backward, and one flat all-reduce after backward.
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/bench_data.h"
#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/platform/threads.h"
#include "meshtrain/train/step.h"

namespace meshtrain::cli {

void add_bench_dp(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  struct Opts : TrainBenchOptions {
    int64_t bucket_mb = 25;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("dp", "data-parallel step time: overlapped DDP buckets vs reduction after backward");
  add_train_bench_options(cmd, *o);
  cmd->add_option("--bucket-mb", o->bucket_mb, "DDP bucket size (MiB)")->capture_default_str();
  runs.emplace_back(cmd, [o]() {
    check_train_bench_options(*o);
    if (o->bucket_mb < 1) throw std::invalid_argument(fmt::format("--bucket-mb {} must be positive", o->bucket_mb));
    if (int rc = relaunch_if_needed(o->nproc); rc >= 0) return rc;
    auto rt = start_runtime(600);
    Comm& dp = rt->world();
    const plan::ModelSpec spec = bench_model(*o);
    Comm solo("solo", rt->rank());
    Transformer model(spec, solo, false, 1);
    AdamWOptions ao;
    ao.lr = 1e-5;
    // Both DDP reducers hook the same parameters; the one not in use has sync off (inert).
    DataParallel overlapped(model.params().params(), dp, DdpOptions{o->bucket_mb << 20, true, false});
    DataParallel after(model.params().params(), dp, DdpOptions{o->bucket_mb << 20, false, false});
    overlapped.set_sync(false);
    after.set_sync(false);
    AdamW opt(model.params().params(), ao);
    TrainStep flat_step(model, opt, dp, solo), ddp_step(model, opt, dp, solo, {Precision::Fp32, nullptr, &overlapped}),
        after_step(model, opt, dp, solo, {Precision::Fp32, nullptr, &after});
    RandomBatches batches(spec, *o, rt->rank());
    const char* names[] = {"DDP, buckets overlapped with backward", "DDP buckets, reduced after backward",
                           "one flat all-reduce after backward"};
    TrainStep* steps[] = {&ddp_step, &after_step, &flat_step};
    DataParallel* reducers[] = {&overlapped, &after, nullptr};
    auto run = [&](int v) {
      for (DataParallel* r : reducers)
        if (r) r->set_sync(false);
      steps[v]->run(batches.next());
      for (DataParallel* r : reducers)
        if (r) r->set_sync(false);
    };
    std::vector<double> times[3];
    for (int v = 0; v < 3; ++v) run(v);  // warm-up
    for (int r = 0; r < o->rounds; ++r) {
      for (int k = 0; k < 3; ++k) {
        const int v = (k + r) % 3;
        for (int i = 0; i < o->steps; ++i) {
          dp.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          run(v);
          times[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      }
    }
    if (rt->rank() == 0) {
      fmt::print("{} ({} parameters, {} MiB of fp32 gradients), {} ranks, micro-batch {} x seq {} per rank, {} "
                 "bucket(s) of <= {} MiB, {} threads per rank; {} rounds x {} steps\n",
                 spec.name, model.params().local_numel(), model.params().local_numel() * 4 >> 20, dp.size(),
                 o->micro_batch, o->seq, overlapped.buckets(), o->bucket_mb, threads_per_rank(dp.size()), o->rounds,
                 o->steps);
      fmt::print("{:<40} {:>15} {:>10}\n", "gradient reduction", "s/step (median)", "vs flat");
      const double flat = median(times[2]);
      for (int v = 0; v < 3; ++v) {
        fmt::print("{:<40} {:>15.3f} {:>10.3f}\n", names[v], median(times[v]), median(times[v]) / flat);
      }
    }
    return 0;
  });
}

}  // namespace meshtrain::cli
