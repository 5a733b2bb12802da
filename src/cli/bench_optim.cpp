// meshtrain bench optim: one AdamW update over a model's parameters, fused
// (one pass per tensor, src/optim/fused_adamw.h) against the same update as
// separate ATen ops, interleaved round by round in the same process, with the
// parameters' real shapes (a preset's ParamStore) and random gradients;
// clipping and weight decay on, as in training.
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>

#include "cli/commands.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/platform/threads.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string model = "gpt2-124m";
  int rounds = 5;
};

int run(const Opts& o) {
  configure_threads(1);
  Comm solo("solo", 0);
  Transformer model(plan::preset(o.model), solo, false, 1);
  auto& params = model.params().params();
  int64_t n = 0;
  for (auto& p : params) {
    p.tensor.mutable_grad() = at::randn_like(p.tensor);
    n += p.tensor.numel();
  }
  AdamWOptions a;
  a.weight_decay = 0.1;
  a.clip_norm = 1.0;
  a.fused = true;
  AdamW fused(params, a);
  a.fused = false;
  AdamW plain(params, a);
  std::vector<double> tf, tp;
  for (int r = 0; r < o.rounds + 1; ++r) {  // round 0 warms up (first-touch of the moments)
    for (AdamW* opt : {&fused, &plain}) {
      const auto t0 = std::chrono::steady_clock::now();
      opt->update(1.0);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) (opt == &fused ? tf : tp).push_back(s);
    }
  }
  const double f = median(tf), p = median(tp);
  fmt::print("{} ({} parameters, {} tensors), {} threads, {} rounds\n", o.model, n, params.size(), threads_per_rank(1),
             o.rounds);
  fmt::print("update                     s (median)   GB/s of state touched\n");
  // Touched per element: fused reads p, g, m, v and writes p, m, v (28 bytes in fp32).
  fmt::print("ATen ops (unfused)         {:>10.4f}\n", p);
  fmt::print("fused, one pass per tensor {:>10.4f}   {:.1f}\n", f, 28.0 * static_cast<double>(n) / f / 1e9);
  fmt::print("fused / unfused time: {:.3f}\n", f / p);
  return 0;
}

}  // namespace

void add_bench_optim(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("optim", "AdamW's update: fused against ATen ops");
  cmd->add_option("--model", o->model, "preset whose parameters are updated")->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "timed rounds (each runs both)")->check(CLI::PositiveNumber)->capture_default_str();
  runs.emplace_back(cmd, [o] { return run(*o); });
}

}  // namespace meshtrain::cli
