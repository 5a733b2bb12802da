// meshtrain bench gemm: the matrix multiplies of one training step
// (plan/gemms.h) timed alone, each shape in the step's dtype and layout
// (transposed views where the model multiplies by one), through the ATen
// calls the model makes (mm, bmm), so the BLAS is the model's. Their sum is
// the floor of a step's time; bench/train.sh divides step times by it.
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Version.h>
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "meshtrain/plan/gemms.h"
#include "meshtrain/platform/threads.h"
#include "meshtrain/train/precision.h"

namespace meshtrain::cli {
namespace {

struct Opts {
  std::string model = "gpt2-124m", precision = "fp32";
  int64_t micro_batch = 4, seq = 256;
  double min_seconds = 0.2;
  bool cold = false;
};

// Bytes of the last-level cache this process runs on (sysfs), twice over: what a
// write must cover to leave no operand of the previous call cached. 0 when
// sysfs does not say.
int64_t eviction_bytes() {
  int64_t largest = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", i));
    std::string size;
    if (!(f >> size)) continue;
    char* unit = nullptr;
    int64_t bytes = std::strtoll(size.c_str(), &unit, 10);  // "32768K", "1M", "512": sysfs's forms
    if (*unit == 'K') bytes <<= 10;
    if (*unit == 'M') bytes <<= 20;
    if (*unit == 'G') bytes <<= 30;
    largest = std::max(largest, bytes);  // unparsable: 0, ignored
  }
  return 2 * largest;
}

// Median seconds of one call of `g` (after a warm-up), repeated for at least `min_seconds` and 3 calls.
// `evict` defined: written before each call (untimed), so the operands come from memory,
// as in a step, where other layers' tensors pass through the caches between two uses of one.
double time_gemm(const plan::Gemm& g, at::ScalarType dtype, double min_seconds, const at::Tensor& evict) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto operand = [&](int64_t rows, int64_t cols, bool trans) {
    at::Tensor t = at::randn({g.batch, trans ? cols : rows, trans ? rows : cols}, gen).to(dtype);
    if (trans) t = t.transpose(1, 2);
    return g.batch == 1 ? t.select(0, 0) : t;
  };
  const at::Tensor a = operand(g.m, g.k, g.trans_a), b = operand(g.k, g.n, g.trans_b);
  auto call = [&] { return g.batch == 1 ? at::mm(a, b) : at::bmm(a, b); };
  call();
  std::vector<double> times;
  double total = 0;
  while (times.size() < 3 || total < min_seconds) {
    if (evict.defined()) evict.fill_(static_cast<double>(times.size()));
    const auto t0 = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    total += times.back();
  }
  return median(times);
}

// bf16/fp16 on a CPU without their matrix instructions: a path many times slower than fp32
// (and slower still for some layouts), so timing a step's GEMMs can take many minutes. Probed
// on a 256-cube product per layout the step uses, in both dtypes; returns the slowest layout's
// time ratio (low / fp32) and estimates the whole command's seconds from the probes.
struct LowPrecisionProbe {
  double slowdown = 1, estimate_seconds = 0;
};

LowPrecisionProbe probe_low_precision(const std::vector<plan::Gemm>& gemms, at::ScalarType dtype, double min_seconds) {
  LowPrecisionProbe out;
  std::map<std::pair<bool, bool>, double> ratio;  // (trans_a, trans_b) -> low / fp32
  double fp32_rate = 0;                            // FLOP/s of the fp32 probes, the fastest layout
  for (const auto& g : gemms) {
    const auto layout = std::make_pair(g.trans_a, g.trans_b);
    if (ratio.count(layout)) continue;
    plan::Gemm cube{"probe", 1, 256, 256, 256, g.trans_a, g.trans_b};
    const double fp32 = time_gemm(cube, at::kFloat, 0.02, {}), low = time_gemm(cube, dtype, 0.02, {});
    ratio[layout] = low / fp32;
    fp32_rate = std::max(fp32_rate, cube.flops() / fp32);
  }
  for (const auto& [layout, r] : ratio) out.slowdown = std::max(out.slowdown, r);
  for (const auto& g : gemms) {
    // time_gemm's calls: one warm-up, then at least 3 and at least min_seconds.
    const double t = g.flops() / static_cast<double>(g.count) / fp32_rate * ratio[{g.trans_a, g.trans_b}];
    out.estimate_seconds += t + std::max(3 * t, min_seconds);
  }
  return out;
}

int run(const Opts& o) {
  const Precision precision = parse_train_precision(o.precision);
  configure_threads(1);
  const plan::ModelSpec& m = plan::preset(o.model);
  const auto gemms = plan::step_gemms(m, o.micro_batch, o.seq);
  at::Tensor evict;
  if (o.cold) {
    const int64_t bytes = eviction_bytes();
    if (bytes == 0) throw std::runtime_error("--cold: sysfs gives no cache sizes here (/sys/devices/system/cpu/cpu0/cache)");
    evict = at::empty({bytes / 4}, at::kFloat);
  }
  const at::ScalarType dtype = compute_dtype(precision);
  if (dtype != at::kFloat) {
    const LowPrecisionProbe probe = probe_low_precision(gemms, dtype, o.min_seconds);
    if (probe.slowdown > 1) {
      const bool fp16 = dtype == at::kHalf;
      fmt::print(stderr,
                 "warning: {} GEMMs run {:.1f}x slower than fp32 ones here (a 256-cube product, the slowest of the "
                 "step's layouts): this CPU (capability {}) has no {} matrix instructions ({}). Timing the step's "
                 "GEMMs will take {:.0f} s at the probe's rates, longer where larger products run slower still; "
                 "--precision fp32 is this CPU's fast path.\n",
                 fp16 ? "fp16" : "bf16", probe.slowdown, at::get_cpu_capability(), fp16 ? "fp16" : "bf16",
                 fp16 ? "avx512_fp16, amx_fp16" : "avx512_bf16, amx_bf16", probe.estimate_seconds);
      std::fflush(stderr);
    }
  }
  fmt::print("{}: the step's matrix multiplies alone, micro-batch {} x seq {}, {}, {} threads{}\n", m.name,
             o.micro_batch, o.seq, o.precision, threads_per_rank(1),
             o.cold ? fmt::format(", operands evicted from the caches before each call ({} MiB written)",
                                  evict.numel() * 4 >> 20)
                    : "");
  // The model's shape as bench/torch_gpt.py's flags (bench/train.sh passes them on).
  fmt::print("shape: {}\n", torch_gpt_shape(m));
  fmt::print("{:<24} {:>5} {:>6} {:>6} {:>6} {:>6} {:>10} {:>9} {:>10}\n", "GEMM", "batch", "m", "n", "k", "count",
             "ms each", "GFLOP/s", "s per step");
  double seconds = 0, flops = 0;
  for (const auto& g : gemms) {
    const double t = time_gemm(g, dtype, o.min_seconds, evict);
    seconds += t * static_cast<double>(g.count);
    flops += g.flops();
    fmt::print("{:<24} {:>5} {:>6} {:>6} {:>6} {:>6} {:>10.3f} {:>9.1f} {:>10.4f}\n", g.name, g.batch, g.m, g.n, g.k,
               g.count, t * 1e3, g.flops() / static_cast<double>(g.count) / t / 1e9,
               t * static_cast<double>(g.count));
  }
  fmt::print("GEMM time per step: {:.4f} s ({:.1f} GFLOP at {:.1f} GFLOP/s)\n", seconds, flops / 1e9,
             flops / seconds / 1e9);
  return 0;
}

}  // namespace

void add_bench_gemm(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("gemm", "a training step's matrix multiplies timed alone (the step's floor)");
  cmd->add_option("--model", o->model, "preset (dense)")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per step")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32 | bf16")->capture_default_str();
  cmd->add_option("--min-seconds", o->min_seconds, "time each GEMM at least this long")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--cold", o->cold,
                "write twice the last-level cache's size before each call: operands from memory, not the caches");
  runs.emplace_back(cmd, [o] { return run(*o); });
}

}  // namespace meshtrain::cli
