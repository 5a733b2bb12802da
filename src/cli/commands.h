// The subcommands of the `meshtrain` binary. Each registers its options on the
// CLI11 app and returns the function that runs it (returning the exit status).
#pragma once

#include "meshtrain/compat.h"
#include "meshtrain/platform/subprocess.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}
namespace meshtrain {
class Runtime;
}
namespace meshtrain::plan {
struct ModelSpec;
}

namespace meshtrain::cli {

using Run = std::function<int()>;

Run add_launch(CLI::App& app);
Run add_bench(CLI::App& app);
// `bench block`, registered by add_bench under its `bench` command.
void add_bench_block(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_train(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_dp(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_zero(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_pipeline(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_attention(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_context(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_optim(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_fused_ops(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_loss(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_gemm(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
void add_bench_rollout(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs);
Run add_ckpt(CLI::App& app);
Run add_diagnose(CLI::App& app);
Run add_lab(CLI::App& app);
Run add_data(CLI::App& app);
Run add_mesh(CLI::App& app);
Run add_matrix(CLI::App& app);
Run add_plan(CLI::App& app);
Run add_plot(CLI::App& app);
Run add_tokenize(CLI::App& app);
Run add_train(CLI::App& app);
Run add_sample(CLI::App& app);
Run add_eval(CLI::App& app);

// Names that `meshtrain launch NAME ...` runs as this binary's own subcommand.
const std::vector<std::string>& subcommand_names();

// The original command line, for commands that re-launch themselves.
void set_argv(int argc, char** argv);
const std::vector<std::string>& original_argv();
using meshtrain::self_exe;  // platform/subprocess.h

// When this process was not started by a launcher and `nproc` > 1 (or
// restarts are asked for), starts `nproc` copies of this very command line
// under the launcher (restarting them all up to `max_restarts` times after a
// failure) and returns its status; returns -1 when the caller should run as a
// rank itself.
int relaunch_if_needed(int nproc, int max_restarts = 0);

using meshtrain::capture_output;

// The options of the data-parallel training benchmarks (bench dp, bench zero).
struct TrainBenchOptions {
  std::string model = "gpt2-124m";
  int64_t micro_batch = 2, seq = 128;
  int steps = 3, rounds = 2, nproc = 2;
};
void add_train_bench_options(CLI::App* cmd, TrainBenchOptions& o);
// Throws std::invalid_argument naming the option that is not positive.
void check_train_bench_options(const TrainBenchOptions& o);

// The median of benchmark samples (the upper one of an even count).
double median(std::vector<double> samples);
// A model's shape as bench/torch_gpt.py's flags (bench/train.sh and scripts/gpu_check.sh pass them on).
std::string torch_gpt_shape(const plan::ModelSpec& m);

// Joins the job the environment describes, with a collective timeout in seconds.
std::unique_ptr<Runtime> start_runtime(double timeout_s, int check_every = 64, BackendKind backend = BackendKind::Gloo);

}  // namespace meshtrain::cli
