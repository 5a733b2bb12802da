// meshtrain bench fused-ops: each fused elementwise operation (nn/fused_ops.h)
// against its ATen composition, forward and backward, at a model's block shape
// (micro-batch x seq rows of hidden and ffn columns), fp32 and bf16 branches
// (autocast's GEMM outputs), interleaved round by round in one process.
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <functional>

#include "cli/commands.h"
#include "meshtrain/nn/fused_ops.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string model = "gpt2-124m";
  int64_t micro_batch = 4, seq = 256;
  int rounds = 7;
};

// One op's forward and backward from fresh leaves: returns the seconds.
using Step = std::function<double(bool fused)>;

// Runs forward, then backward from `up` into each of its outputs.
double timed(const std::function<std::vector<at::Tensor>()>& forward, const at::Tensor& up) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<at::Tensor> out = forward();
  torch::autograd::backward(out, std::vector<at::Tensor>(out.size(), up));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Opts& o) {
  configure_threads(1);
  const plan::ModelSpec m = plan::preset(o.model);
  const int64_t rows = o.micro_batch * o.seq, h = m.hidden, f = m.ffn;
  auto leaf = [](at::Tensor t) { return t.requires_grad_(); };
  struct Op {
    std::string name;
    Step step;
  };
  std::vector<Op> ops;
  for (auto type : {at::kFloat, at::kBFloat16}) {
    const std::string t = type == at::kFloat ? "fp32" : "bf16";
    const auto up_h = at::randn({rows, h}), up_f = at::randn({rows, f}).to(type);
    if (type == at::kFloat) {  // a norm's input is the residual stream, fp32 in both modes
      ops.push_back({"layernorm", [=](bool fused) {
                       const nn::NormWeights n{leaf(at::randn({h})), leaf(at::randn({h}))};
                       const at::Tensor x = leaf(at::randn({rows, h}));
                       return timed(
                           [&] { return std::vector<at::Tensor>{fused ? nn::norm(x, n) : nn::norm_reference(x, n)}; },
                           up_h);
                     }});
      ops.push_back({"rmsnorm", [=](bool fused) {
                       const nn::NormWeights n{leaf(at::randn({h})), {}, 1e-5, true};
                       const at::Tensor x = leaf(at::randn({rows, h}));
                       return timed(
                           [&] { return std::vector<at::Tensor>{fused ? nn::norm(x, n) : nn::norm_reference(x, n)}; },
                           up_h);
                     }});
    }
    ops.push_back({"bias+add+layernorm " + t, [=](bool fused) {
                     const nn::NormWeights n{leaf(at::randn({h})), leaf(at::randn({h}))};
                     const nn::BranchJoin j{leaf(at::randn({h})), {}, 0};
                     const at::Tensor r = leaf(at::randn({rows, h})), a = leaf(at::randn({rows, h}).to(type));
                     return timed(
                         [&] {
                           const auto [s, y] = fused ? nn::add_norm(r, a, j, n) : nn::add_norm_reference(r, a, j, n);
                           return std::vector<at::Tensor>{s, y};  // both used, as in a block
                         },
                         up_h);
                   }});
    ops.push_back(
        {"bias+gelu " + t, [=](bool fused) {
           const at::Tensor x = leaf(at::randn({rows, f}).to(type)), b = leaf(at::randn({f}));
           return timed(
               [&] { return std::vector<at::Tensor>{fused ? nn::bias_gelu(x, b) : nn::bias_gelu_reference(x, b)}; },
               up_f);
         }});
    ops.push_back({"swiglu " + t, [=](bool fused) {
                     const at::Tensor g = leaf(at::randn({rows, f}).to(type)), u = leaf(at::randn({rows, f}).to(type));
                     return timed(
                         [&] { return std::vector<at::Tensor>{fused ? nn::swiglu(g, u) : nn::swiglu_reference(g, u)}; },
                         up_f);
                   }});
  }
  fmt::print("{}: {} rows (micro-batch {} x seq {}), hidden {}, ffn {}; {} threads, {} rounds, forward + backward\n",
             o.model, rows, o.micro_batch, o.seq, h, f, threads_per_rank(1), o.rounds);
  fmt::print("{:<30} {:>12} {:>12} {:>8}\n", "op", "ATen ms", "fused ms", "ratio");
  double total_fused = 0, total_plain = 0;
  for (const auto& op : ops) {
    std::vector<double> tf, tp;
    for (int r = 0; r < o.rounds + 1; ++r) {  // round 0 warms up
      const double a = op.step(true), b = op.step(false);
      if (r > 0) tf.push_back(a), tp.push_back(b);
    }
    const double fm = median(tf), pm = median(tp);
    total_fused += fm, total_plain += pm;
    fmt::print("{:<30} {:>12.3f} {:>12.3f} {:>8.3f}\n", op.name, pm * 1e3, fm * 1e3, fm / pm);
  }
  fmt::print("all ops: fused / ATen time: {:.3f}\n", total_fused / total_plain);
  return 0;
}

}  // namespace

void add_bench_fused_ops(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("fused-ops", "fused elementwise ops (norms, bias+GELU, SwiGLU) against ATen");
  cmd->add_option("--model", o->model, "preset whose block shape is used")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq", o->seq, "tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "timed rounds (each runs both)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  runs.emplace_back(cmd, [o] { return run(*o); });
}

}  // namespace meshtrain::cli
