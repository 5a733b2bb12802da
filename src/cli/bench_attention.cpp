// meshtrain bench attention: causal attention forward + backward, the naive
// algorithm (scores materialised, nn::causal_attention) against the tiled one
// (nn::tiled_attention) and libtorch's at::scaled_dot_product_attention
// (nn::sdpa_causal_attention: on the CPU its flash kernel, which keeps a
// log-sum-exp per row as the tiled one does), over sequence lengths. Each (algorithm, length) runs
// in a child process of its own (`--only`), so that its peak resident memory
// (getrusage's high-water mark, minus the child's before the first call) is
// its own. Beside the measurement: the bytes each algorithm moves between main
// memory and the cache, by the IO model of the FlashAttention paper
// (nn::naive_attention_io and nn::tiled_attention_io in nn/tiled_attention.h).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/nn/tiled_attention.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/platform/threads.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string seqs = "512,1024,2048,4096,8192", only;
  int64_t batch = 1, heads = 4, head_dim = 64, block = nn::TiledAttentionOptions{}.block_q, seq = 0;
  int iters = 3, threads = 2;
};

// One algorithm at one length, in this process: "seconds peak_bytes".
int run_one(const Opts& o) {
  setenv("OMP_NUM_THREADS", std::to_string(o.threads).c_str(), 1);  // threads_per_rank reads it
  configure_threads(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor q0 = at::randn({o.batch, o.heads, o.seq, o.head_dim}, gen);
  const at::Tensor k0 = at::randn({o.batch, o.heads, o.seq, o.head_dim}, gen);
  const at::Tensor v0 = at::randn({o.batch, o.heads, o.seq, o.head_dim}, gen);
  const at::Tensor g = at::randn({o.batch, o.heads, o.seq, o.head_dim}, gen);
  const std::string& a = o.only;
  const double before = peak_rss_bytes();
  std::vector<double> times;
  for (int i = 0; i < o.iters + 1; ++i) {  // the first is a warm-up
    at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor out = a == "tiled" ? nn::tiled_attention(q, k, v, {}, {o.block, o.block})
                     : a == "sdpa"  ? nn::sdpa_causal_attention(q, k, v)
                                    : nn::causal_attention(q, k, v);
    out.backward(g);
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  fmt::print("{} {}\n", median(times), peak_rss_bytes() - before);
  return 0;
}

}  // namespace

void add_bench_attention(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("attention", "causal attention forward+backward: naive (scores materialised), tiled, sdpa");
  cmd->add_option("--seqs", o->seqs, "sequence lengths, comma-separated")->capture_default_str();
  cmd->add_option("--batch", o->batch, "batch")->capture_default_str();
  cmd->add_option("--heads", o->heads, "heads (q = kv)")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim, "head dimension")->capture_default_str();
  cmd->add_option("--block", o->block, "tile size of the tiled algorithm (query and key)")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations per point (after one warm-up)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "compute threads")->capture_default_str();
  cmd->add_option("--only", o->only, "internal: run one algorithm (naive | tiled | sdpa) at --seq in this process");
  cmd->add_option("--seq", o->seq, "internal: with --only");
  runs.emplace_back(cmd, [o]() {
    if (o->batch < 1 || o->heads < 1 || o->head_dim < 1 || o->block < 1 || o->iters < 1 || o->threads < 1) {
      throw std::invalid_argument("--batch, --heads, --head-dim, --block, --iters and --threads must be positive");
    }
    if (!o->only.empty()) {
      if (o->only != "naive" && o->only != "tiled" && o->only != "sdpa") {
        throw std::invalid_argument("--only naive | tiled | sdpa");
      }
      return run_one(*o);
    }
    std::vector<int64_t> seqs;
    std::stringstream in(o->seqs);
    for (std::string s; std::getline(in, s, ',');) seqs.push_back(std::stoll(s));
    fmt::print("causal attention, fp32, batch {} x {} heads x head_dim {}, {} threads, tiles {} x {}; forward + "
               "backward, median of {} iterations; peak = resident high-water mark over the calls\n",
               o->batch, o->heads, o->head_dim, o->threads, o->block, o->block, o->iters);
    // Speedups: the naive time over each algorithm's.
    fmt::print("{:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "seq", "naive ms", "tiled ms",
               "sdpa ms", "tiled", "sdpa", "naive peak", "tiled peak", "sdpa peak", "naive IO", "tiled IO");
    const double avail = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    const char* algorithms[3] = {"naive", "tiled", "sdpa"};
    for (int64_t s : seqs) {
      // IO model (elements per head), x 4 bytes x batch x heads.
      const double ss = static_cast<double>(s) * s;
      const double scale = 4.0 * o->batch * o->heads;
      const double io_naive = scale * nn::naive_attention_io(s, o->head_dim);
      const double io_tiled = scale * nn::tiled_attention_io(s, o->head_dim, o->block);
      double t[3] = {0, 0, 0}, peak[3] = {0, 0, 0};
      // The naive forward + backward peaks at about nine s x s fp32 tensors per head
      // (measured here: 9.04 GiB at s = 8192 with 4 heads, i.e. 9 x 1 GiB).
      const double naive_need = 9.0 * scale * ss;
      const bool naive_fits = naive_need < avail;
      for (int a = naive_fits ? 0 : 1; a < 3; ++a) {
        std::istringstream r(capture_output({self_exe(), "bench", "attention", "--only", algorithms[a], "--seq",
                                             std::to_string(s), "--batch", std::to_string(o->batch), "--heads",
                                             std::to_string(o->heads), "--head-dim", std::to_string(o->head_dim),
                                             "--block", std::to_string(o->block), "--iters", std::to_string(o->iters),
                                             "--threads", std::to_string(o->threads)}));
        if (!(r >> t[a] >> peak[a])) {
          throw std::runtime_error(fmt::format("bench attention: no result for {} at seq {}", algorithms[a], s));
        }
      }
      auto ms = [&](int a) { return naive_fits || a > 0 ? fmt::format("{:.1f}", 1e3 * t[a]) : std::string("-"); };
      auto speedup = [&](int a) { return naive_fits ? fmt::format("{:.2f}x", t[0] / t[a]) : std::string("-"); };
      auto mem = [&](int a) { return naive_fits || a > 0 ? plan::human_bytes(peak[a]) : std::string("-"); };
      fmt::print("{:>7} {:>9} {:>9} {:>9} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11}{}\n", s, ms(0), ms(1), ms(2),
                 speedup(1), speedup(2), mem(0), mem(1), mem(2), plan::human_bytes(io_naive), plan::human_bytes(io_tiled),
                 naive_fits ? std::string() : fmt::format("   naive not run: needs ~{}, {} free",
                                                          plan::human_bytes(naive_need), plan::human_bytes(avail)));
    }
    return 0;
  });
}

}  // namespace meshtrain::cli
