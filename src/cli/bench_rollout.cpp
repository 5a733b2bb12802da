// meshtrain bench rollout: generated tokens per second of batched rollouts
// (rl/rollout.h: B completions through one KV cache) against the same B
// completions one at a time, on the demo model's shape (random weights: the
// cost does not depend on them), one process.
#include <CLI/CLI.hpp>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/rl/rollout.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain::cli {

void add_bench_rollout(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  struct Opts {
    int64_t batch = 16, prompt = 16, tokens = 64;
    double temperature = 1.0;
    int iters = 3;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("rollout", "RL rollouts: batched generation vs one sequence at a time");
  cmd->add_option("--batch", o->batch, "completions per batch")->capture_default_str();
  cmd->add_option("--prompt", o->prompt, "prompt tokens")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "generated tokens per completion")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed repetitions (median)")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")->capture_default_str();
  runs.emplace_back(cmd, [o]() {
    configure_threads(1);
    plan::ModelSpec spec = plan::preset("gpt-tiny");  // configs/kjv-tiny.toml's shape
    spec.layers = 4, spec.hidden = 128, spec.heads = 4, spec.kv_heads = 4, spec.ffn = 512, spec.vocab = 4096;
    spec.seq = o->prompt + o->tokens;
    Comm solo("tp", 0);
    Transformer m(spec, solo, false, 1);
    const at::Tensor prompts = at::randint(spec.vocab, {o->batch, o->prompt}, at::kLong);
    RolloutOptions ro;
    ro.sample.max_new_tokens = o->tokens;
    ro.sample.temperature = o->temperature;  // no stop token: every completion is o->tokens long
    std::vector<uint64_t> seeds;
    for (int64_t b = 0; b < o->batch; ++b) seeds.push_back(static_cast<uint64_t>(b + 1));
    auto timed = [&](bool batched) {
      std::vector<double> t;
      for (int i = 0; i < o->iters + 1; ++i) {  // the first is a warm-up
        const auto t0 = std::chrono::steady_clock::now();
        if (batched) {
          rollout(m, prompts, ro, seeds);
        } else {
          for (int64_t b = 0; b < o->batch; ++b) rollout(m, prompts.narrow(0, b, 1), ro, {seeds[b]});
        }
        if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return median(t);
    };
    const double one = timed(false), all = timed(true);
    const double generated = static_cast<double>(o->batch * o->tokens);
    fmt::print("model {} layers x {} hidden, vocabulary {}; {} completions of {} tokens after a {}-token prompt\n",
               spec.layers, spec.hidden, spec.vocab, o->batch, o->tokens, o->prompt);
    fmt::print("one at a time: {:.3f} s, {:.0f} generated tokens/s\n", one, generated / one);
    fmt::print("batched:       {:.3f} s, {:.0f} generated tokens/s\n", all, generated / all);
    fmt::print("speedup {:.2f}x\n", one / all);
    return 0;
  });
}

}  // namespace meshtrain::cli
