// meshtrain bench context --nproc CP [--seq 8192] [--impl ring|ulysses|allgather]:
// one training forward + backward of a model on a sequence spread over CP
// context-parallel ranks (the launched ranks), against nothing but itself: the
// step time, each rank's activation memory (resident high-water mark during the
// steps minus before them, the largest over ranks), and for ring attention the
// time inside the ring op and the part of it spent waiting for a K/V or dK/dV
// block that had not arrived when the computation on the block in hand was
// done (communication not hidden behind computation). Run it with CP = 1, 2, 4
// at one length to compare (bench/context.sh).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/context/ring_attention.h"
#include "meshtrain/parallel/context/zigzag.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string config = "configs/kjv-tiny.toml", impl = "ring", attention = "tiled", label;
  int64_t seq = 8192, batch = 1;
  int iters = 2, nproc = 1;
};

int run(const Opts& o) {
  if (int rc = relaunch_if_needed(o.nproc); rc >= 0) return rc;
  const plan::CpImpl impl = plan::parse_cp_impl(o.impl);
  TrainConfig c = load_train_config(o.config, {"train.seq=" + std::to_string(o.seq), "model.dropout=0.0",
                                               "model.attention=\"" + o.attention + "\""});
  auto rt = start_runtime(600);
  Comm& cp = rt->world();
  plan::validate_context_parallel(c.model, o.seq, cp.size(), 1, false, impl);
  Comm solo("solo", rt->rank());
  Transformer model(c.model, solo, false, c.seed);
  model.set_context_parallel(cp, impl);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);  // the same sequence on every rank
  const at::Tensor all = at::randint(c.model.vocab, {o.batch, o.seq + 1}, gen, at::kLong);
  const ZigZag z(o.seq, cp.size(), cp.rank());
  const at::Tensor tokens = z.shard(all.narrow(1, 0, o.seq), 1).contiguous();
  const at::Tensor targets = z.shard(all.narrow(1, 1, o.seq), 1).contiguous();
  const double before = peak_rss_bytes();
  std::vector<double> times, ring, wait;
  for (int i = 0; i < o.iters + 1; ++i) {  // the first is a warm-up
    for (auto& p : model.params().params()) p.tensor.mutable_grad() = at::Tensor();
    ring_stats() = {};
    cp.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    (model.forward(tokens, targets).sum() / static_cast<double>(o.batch * o.seq)).backward();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i == 0) continue;
    times.push_back(dt);
    ring.push_back(ring_stats().total_s);
    wait.push_back(ring_stats().wait_s);
  }
  // The slowest rank's step, the largest activation peak; ring times of the rank with the most waiting.
  at::Tensor m = at::tensor({median(times), peak_rss_bytes() - before, median(wait), median(ring)}, at::kDouble);
  cp.all_reduce(m, ReduceOp::Max);
  if (rt->rank() == 0) {
    const double step = m[0].item<double>(), act = m[1].item<double>(), w = m[2].item<double>(),
                 r = m[3].item<double>();
    fmt::print("{:>3} {:>10} {:>7} {:>10.2f} {:>10.0f} {:>12} {:>9} {}\n", cp.size(),
               !o.label.empty() ? o.label : cp.size() > 1 ? o.impl : "-",
               o.seq, step, static_cast<double>(o.batch * o.seq) / step, plan::human_bytes(act),
               impl == plan::CpImpl::Ring && cp.size() > 1 ? fmt::format("{:.2f}", r) : "-",
               impl == plan::CpImpl::Ring && cp.size() > 1
                   ? fmt::format("{:.3f} s waiting = {:.1f}% of ring attention", w, 100 * w / r)
                   : "");
  }
  return 0;
}

}  // namespace

void add_bench_context(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("context", "context parallelism: a forward+backward step over cp = --nproc ranks");
  cmd->add_option("--nproc", o->nproc, "context-parallel ranks (cp)")->capture_default_str();
  cmd->add_option("--config", o->config, "the model of this training config")->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  cmd->add_option("--impl", o->impl, "ring | ulysses | allgather")->capture_default_str();
  cmd->add_option("--attention", o->attention, "local attention of ulysses and allgather: tiled | naive")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed steps (after one warm-up)")->capture_default_str();
  cmd->add_option("--label", o->label, "printed in the impl column instead");
  cmd->add_flag_callback("--header", [] {
    fmt::print("{:>3} {:>10} {:>7} {:>10} {:>10} {:>12} {:>9} {}\n", "cp", "impl", "seq", "step s", "tokens/s",
               "activations", "ring s", "ring: communication not hidden");
  }, "print the column names and exit");
  runs.emplace_back(cmd, [o, cmd]() {
    if (cmd->count("--header")) return 0;
    if (o->seq < 1 || o->batch < 1 || o->iters < 1 || o->nproc < 1) {
      throw std::invalid_argument("--seq, --batch, --iters and --nproc must be positive");
    }
    return run(*o);
  });
}

}  // namespace meshtrain::cli
