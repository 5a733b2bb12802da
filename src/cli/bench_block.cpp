// meshtrain bench block: forward + backward of one transformer block through
// meshtrain's tensor-parallel layers at tp = 1, against the same block written
// as plain ATen calls on the same weights, interleaved in the same run.
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain::cli {
namespace {

// The block as one would write it by hand: no regions, no wrappers.
at::Tensor plain_block(const plan::ModelSpec& m, const Block& b, const at::Tensor& x) {
  const bool ln = m.norm == plan::Norm::LayerNorm;
  auto norm = [&](const at::Tensor& t, const at::Tensor& w, const at::Tensor& bias) {
    return ln ? nn::layer_norm(t, w, bias, m.norm_eps) : nn::rms_norm(t, w, m.norm_eps);
  };
  const int64_t s = x.size(0), bs = x.size(1), d = m.head_dim();
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({s, bs, n, d}).permute({1, 2, 0, 3}); };
  at::Tensor h1 = norm(x, b.norm1_w, b.norm1_b);
  at::Tensor q = heads(at::linear(h1, b.q.weight, b.q.bias), m.heads);
  at::Tensor k = heads(at::linear(h1, b.k.weight, b.k.bias), m.kv_heads);
  at::Tensor v = heads(at::linear(h1, b.v.weight, b.v.bias), m.kv_heads);
  if (m.position == plan::Position::RoPE) {
    q = nn::rope(q, m.rope_theta);
    k = nn::rope(k, m.rope_theta);
  }
  at::Tensor ctx = nn::causal_attention(q, k, v).permute({2, 0, 1, 3}).reshape({s, bs, m.heads * d});
  at::Tensor y = x + at::linear(ctx, b.o.weight, b.o.bias);
  at::Tensor h2 = norm(y, b.norm2_w, b.norm2_b);
  at::Tensor f = m.activation == plan::Activation::SwiGLU
                     ? at::silu(at::linear(h2, b.gate.weight)) * at::linear(h2, b.up.weight)
                     : at::gelu(at::linear(h2, b.fc1.weight, b.fc1.bias), "tanh");
  return y + at::linear(f, b.fc2.weight, b.fc2.bias);
}

}  // namespace

void add_bench_block(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  struct Opts {
    std::string model = "gpt2-124m";
    int64_t batch = 4, seq = 256;
    int iters = 10, warmup = 2;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("block", "one block's forward+backward: tensor-parallel layers (tp=1) vs plain ATen");
  cmd->add_option("--model", o->model, "model preset (one of its blocks is timed)");
  cmd->add_option("--batch", o->batch, "micro-batch");
  cmd->add_option("--seq", o->seq, "sequence length");
  cmd->add_option("--iters", o->iters, "timed iterations of each");
  cmd->add_option("--warmup", o->warmup, "untimed iterations of each");
  runs.emplace_back(cmd, [o]() {
    if (o->batch < 1 || o->seq < 1 || o->iters < 1 || o->warmup < 0) {
      throw std::invalid_argument(fmt::format("--batch {}, --seq {} and --iters {} must be positive, --warmup {} >= 0",
                                              o->batch, o->seq, o->iters, o->warmup));
    }
    configure_threads(1);
    plan::ModelSpec spec = plan::preset(o->model);
    spec.layers = 1;
    spec.dropout = 0;
    Comm solo("solo", 0);
    Transformer model(spec, solo, false, 1);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    at::Tensor x0 = at::randn({o->seq, o->batch, spec.hidden}, gen);
    at::Tensor gy = at::randn({o->seq, o->batch, spec.hidden}, gen);
    auto step = [&](bool ours) {
      at::Tensor x = x0.clone().set_requires_grad(true);
      at::Tensor y = ours ? model.block_forward(0, x, true) : plain_block(spec, model.block(0), x);
      y.backward(gy);
      for (auto& p : model.params().params()) p.tensor.mutable_grad() = at::Tensor();
      return y;
    };
    // Same math: outputs must agree before anything is timed.
    const double diff = (step(true) - step(false)).abs().max().item<double>();
    if (diff > 1e-5) throw std::runtime_error(fmt::format("block outputs differ by {}", diff));
    for (int i = 0; i < o->warmup; ++i) step(true), step(false);
    std::vector<double> ours, plain;
    for (int i = 0; i < o->iters; ++i) {
      for (bool which : {i % 2 == 0, i % 2 != 0}) {  // alternate who goes first
        auto t0 = std::chrono::steady_clock::now();
        step(which);
        (which ? ours : plain).push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    const double tokens = static_cast<double>(o->batch * o->seq);
    const double t_ours = median(ours), t_plain = median(plain);
    fmt::print("block of {} (h={}, heads={}, ffn={}), batch {} x seq {}, fp32, {} threads, {} iterations each\n",
               spec.name, spec.hidden, spec.heads, spec.ffn, o->batch, o->seq, threads_per_rank(1), o->iters);
    fmt::print("{:<28} {:>12} {:>12}\n", "implementation", "ms (median)", "tokens/s");
    fmt::print("{:<28} {:>12.2f} {:>12.0f}\n", "plain ATen", 1e3 * t_plain, tokens / t_plain);
    fmt::print("{:<28} {:>12.2f} {:>12.0f}\n", "meshtrain tp layers (tp=1)", 1e3 * t_ours, tokens / t_ours);
    fmt::print("overhead: {:+.1f}% (time ratio {:.3f})\n", 100 * (t_ours / t_plain - 1), t_ours / t_plain);
    return 0;
  });
}

}  // namespace meshtrain::cli
