#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <algorithm>
#include <chrono>
#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/launcher.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::cli {
namespace {
std::vector<std::string> g_argv;
}

const std::vector<std::string>& subcommand_names() {
  static const std::vector<std::string> names{"bench", "lab", "mesh", "train"};
  return names;
}

void set_argv(int argc, char** argv) { g_argv.assign(argv, argv + argc); }
const std::vector<std::string>& original_argv() { return g_argv; }

int relaunch_if_needed(int nproc, int max_restarts) {
  if (DistEnv::from_environment().distributed() || (nproc <= 1 && max_restarts == 0)) return -1;
  LaunchOptions o;
  o.nproc_per_node = std::max(1, nproc);
  o.max_restarts = max_restarts;
  o.master_port = 0;
  o.command = g_argv;
  o.command[0] = self_exe();
  return launch(o);
}

std::unique_ptr<Runtime> start_runtime(double timeout_s, int check_every, BackendKind backend) {
  if (!(timeout_s > 0)) {
    throw std::invalid_argument(fmt::format("--timeout {} must be a positive number of seconds", timeout_s));
  }
  RuntimeOptions opts;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  opts.check_every = check_every;
  opts.backend = backend;
  return Runtime::init(DistEnv::from_environment(), opts);
}

}  // namespace meshtrain::cli

namespace meshtrain::cli {

void add_train_bench_options(CLI::App* cmd, TrainBenchOptions& o) {
  cmd->add_option("--model", o.model, "model preset")->capture_default_str();
  cmd->add_option("--micro-batch", o.micro_batch, "sequences per rank per step")->capture_default_str();
  cmd->add_option("--seq", o.seq, "sequence length")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps per round and variant")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "rounds (the order of variants rotates)")->capture_default_str();
  cmd->add_option("--nproc", o.nproc, "ranks to start on this machine")->capture_default_str();
}

void check_train_bench_options(const TrainBenchOptions& o) {
  for (auto [name, v] : {std::pair<const char*, int64_t>{"--micro-batch", o.micro_batch}, {"--seq", o.seq},
                         {"--steps", o.steps}, {"--rounds", o.rounds}, {"--nproc", o.nproc}}) {
    if (v < 1) throw std::invalid_argument(fmt::format("{} {} must be positive", name, v));
  }
}

std::string torch_gpt_shape(const plan::ModelSpec& m) {
  return fmt::format("--layers {} --hidden {} --heads {} --kv-heads {} --ffn {} --vocab {} --norm {} --norm-eps {} "
                     "--activation {} --position {} --rope-theta {} --tied {} --bias {}",
                     m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, plan::padded_vocab(m.vocab, 128),
                     m.norm == plan::Norm::LayerNorm ? "layernorm" : "rmsnorm", m.norm_eps,
                     m.activation == plan::Activation::SwiGLU ? "swiglu" : "gelu",
                     m.position == plan::Position::RoPE ? "rope" : "learned", m.rope_theta, int{m.tied}, int{m.bias});
}

double median(std::vector<double> samples) {
  if (samples.empty()) throw std::invalid_argument("median of no samples");
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace meshtrain::cli
