// meshtrain bench loss: the output layer and its cross-entropy, forward and
// backward, at a model's head shape (micro-batch x seq rows of hidden features
// against the padded vocabulary), fp32 and bf16 (CPU autocast): the fused loss
// (parallel/tensor/fused_cross_entropy.h) with chunks of the default size
// (plan::fused_loss_chunk_rows), with chunks of at most 64 MiB of logits (the
// rule before its floor of `hidden` rows), in one chunk, and the unfused pair
// (at::linear, then at::cross_entropy_loss on fp32 logits); interleaved round
// by round in one process, medians; on the CPU (2 threads a rank's share) or
// on cuda:0 (autocast on CUDA; each variant's time after the device synchronises).
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>

#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/compat.h"
#include "meshtrain/parallel/tensor/fused_cross_entropy.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string model = "gpt2-124m", device = "cpu";
  int64_t micro_batch = 4, seq = 256;
  int rounds = 7;
};

struct Variant {
  std::string name;
  int64_t chunk_rows;  // 0: the unfused pair
};

int run(const Opts& o) {
  configure_threads(1);
  bind_compute_device(resolve_device(parse_device(o.device), cuda_device_count(), 1), 0);
  const c10::Device dev = compute_device();
  const auto on = at::TensorOptions().device(dev);
  const plan::ModelSpec m = plan::preset(o.model);
  const int64_t n = o.micro_batch * o.seq, h = m.hidden, v = plan::padded_vocab(m.vocab, 128);
  Comm solo("solo", 0);
  const int64_t old_rows = std::max<int64_t>(1, plan::kFusedLossChunkBytes / (v * 4));
  const int64_t old_chunks = (n + old_rows - 1) / old_rows;
  const std::vector<Variant> variants = {
      {"fused, default chunks", plan::fused_loss_chunk_rows(n, v, h)},
      {"fused, chunks within 64 MiB", (n + old_chunks - 1) / old_chunks},
      {"fused, one chunk", n},
      {"unfused (linear, cross_entropy)", 0}};
  const at::Tensor targets = at::randint(m.vocab, {n}, on.dtype(at::kLong));
  fmt::print("{}: {} rows (micro-batch {} x seq {}) x hidden {} against vocabulary {} (padded); {} threads, {} rounds, "
             "forward + backward on {}\n",
             o.model, n, o.micro_batch, o.seq, h, v, threads_per_rank(1), o.rounds, compute_device_name());
  fmt::print("{:<32} {:>5} {:>11} {:>12} {:>12}\n", "loss", "dtype", "chunk rows", "logits MiB", "ms");
  for (auto type : {at::kFloat, at::kBFloat16}) {
    const std::string t = type == at::kFloat ? "fp32" : "bf16";
    std::vector<std::vector<double>> times(variants.size());
    for (int r = 0; r < o.rounds + 1; ++r) {  // round 0 warms up
      for (size_t i = 0; i < variants.size(); ++i) {
        const at::Tensor x = (at::randn({n, h}, on) * 0.5).requires_grad_();
        const at::Tensor w = (at::randn({v, h}, on) * 0.02).requires_grad_();
        const AutocastSwitch before = autocast_switch(dev.type());
        set_autocast_switch(dev.type(), {type != at::kFloat, at::kBFloat16});
        synchronize_compute_device();
        const auto t0 = std::chrono::steady_clock::now();
        at::Tensor loss;
        if (variants[i].chunk_rows > 0) {
          loss = fused_linear_cross_entropy(x, w, targets, solo, 0, m.vocab, variants[i].chunk_rows);
        } else {
          loss = at::cross_entropy_loss(at::linear(x, w).to(at::kFloat), targets, {}, at::Reduction::None);
        }
        loss.sum().backward();
        synchronize_compute_device();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        set_autocast_switch(dev.type(), before);
        if (r > 0) times[i].push_back(s);
      }
    }
    for (size_t i = 0; i < variants.size(); ++i) {
      const int64_t rows = variants[i].chunk_rows > 0 ? variants[i].chunk_rows : n;
      fmt::print("{:<32} {:>5} {:>11} {:>12.1f} {:>12.3f}\n", variants[i].name, t,
                 variants[i].chunk_rows > 0 ? fmt::format("{}", rows) : "-", 4.0 * rows * v / (1 << 20),
                 median(times[i]) * 1e3);
    }
  }
  return 0;
}

}  // namespace

void add_bench_loss(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("loss", "the output layer and cross-entropy: fused by chunks of rows vs unfused");
  cmd->add_option("--model", o->model, "preset whose head shape is used")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq", o->seq, "tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--device", o->device, "cpu | cuda (cuda:0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "timed rounds (each runs every variant)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  runs.emplace_back(cmd, [o] { return run(*o); });
}

}  // namespace meshtrain::cli
