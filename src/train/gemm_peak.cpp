#include "meshtrain/train/gemm_peak.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "meshtrain/platform/device.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// Below this share of CPU time (process CPU seconds / (wall seconds x threads)) during the
// all-core GEMMs, other processes shared the cores; unshared runs measure 0.95-1.06 here.
constexpr double kSharedCpuShare = 0.75;
// Under this share of the host's cached best, the rate now is low: probed again, then a warning.
constexpr double kLowRate = 0.7;

// ATen's and OpenBLAS's thread counts (fp32 GEMM runs in OpenBLAS, which keeps its own: PLATFORM.md) set to
// `threads` for the guard's life.
class Threads {
 public:
  explicit Threads(int threads) {
    set_blas_ = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    auto get_blas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    before_ = at::get_num_threads(), blas_before_ = get_blas ? get_blas() : 0;
    at::set_num_threads(threads);
    if (set_blas_) set_blas_(threads);
  }
  ~Threads() {
    at::set_num_threads(before_);
    if (set_blas_ && blas_before_ > 0) set_blas_(blas_before_);
  }

 private:
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  SetThreads set_blas_ = nullptr;
  int before_ = 1, blas_before_ = 0;
};

// Calls f until `seconds` passed; returns calls per second.
template <typename F>
double rate(double seconds, F f) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int64_t calls = 0;
  double dt = 0;
  do {
    f();
    ++calls;
    dt = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (dt < seconds);
  return static_cast<double>(calls) / dt;
}

// Seconds of CPU time of `clock` (CLOCK_PROCESS_CPUTIME_ID: every thread of the process;
// CLOCK_THREAD_CPUTIME_ID: the calling thread).
double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::string machine_key(const std::string& what, int threads) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string cpu = "unknown cpu";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  if (what.rfind("cuda_", 0) == 0) return fmt::format("{} | {} | {}", host, compute_device_name(), what);
  return fmt::format("{} | {} | {} threads | {}", host, cpu, threads, what);
}

double measure(const std::string& what, int threads) {
  if (what == "cuda_gemm_fp32") return measure_cuda_gemm_flops(false);
  if (what == "cuda_gemm_bf16") return measure_cuda_gemm_flops(true);
  if (what == "gemm_fp32") return measure_gemm_flops(threads);
  if (what == "gemm_bf16") return measure_gemm_flops(threads, 0.3, 512, true);
  if (what == "copy") return measure_copy_bandwidth(threads);
  throw std::invalid_argument(fmt::format("machine peak '{}': use gemm_fp32, gemm_bf16 or copy", what));
}

}  // namespace

GemmRate measure_gemm_rate(int threads, double seconds, int n, bool bf16) {
  Threads guard(threads);
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  // x Wᵀ, the layout of every linear's forward: on CPUs without bf16 instructions libtorch 2.11's
  // bf16 GEMM of two row-major operands takes a path 14x slower than this one (1.3 against 18
  // GFLOP/s on an AMD EPYC at 512; fp32 alike either way).
  const at::Tensor a = at::randn({n, n}).to(dtype), w = at::randn({n, n}).to(dtype), wt = w.t();
  at::Tensor c = at::mm(a, wt);
  rate(0.05, [&] { at::mm_out(c, a, wt); });  // warm-up: the threads started, the clocks up
  // The fastest of ~10 slices: the host's rate is what its GEMMs reach when nothing interrupts them,
  // and another process's burst only ever lowers a slice (a peak, never a best-ever across runs).
  double best = 0;
  const double cpu0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto t0 = std::chrono::steady_clock::now();
  for (double spent = 0; spent < seconds;) {
    const double slice = std::max(seconds / 10, 0.02);
    best = std::max(best, rate(slice, [&] { at::mm_out(c, a, wt); }));
    spent += slice;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  GemmRate out;
  out.flops = 2.0 * n * n * static_cast<double>(n) * best;
  out.cpu_share = (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / (wall * threads);
  return out;
}

double measure_gemm_flops(int threads, double seconds, int n, bool bf16) {
  return measure_gemm_rate(threads, seconds, n, bf16).flops;
}

double measure_core_gemm_flops(double seconds, int n, bool bf16) {
  Threads guard(1);  // one thread: the GEMM runs on the calling thread, whose CPU clock counts only it
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  const at::Tensor a = at::randn({n, n}).to(dtype), wt = at::randn({n, n}).to(dtype).t();
  at::Tensor c = at::mm(a, wt);
  rate(0.02, [&] { at::mm_out(c, a, wt); });
  int64_t calls = 0;
  const double cpu0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  double cpu = 0;
  do {
    at::mm_out(c, a, wt);
    ++calls;
    cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  } while (cpu < seconds);
  return 2.0 * n * n * static_cast<double>(n) * static_cast<double>(calls) / cpu;
}

double measure_cuda_gemm_flops(bool bf16, double seconds, int n) {
  if (!computes_on_cuda()) throw std::invalid_argument("a CUDA GEMM rate needs a process bound to a CUDA device");
  const auto o = at::TensorOptions(compute_device()).dtype(bf16 ? at::kBFloat16 : at::kFloat);
  const at::Tensor a = at::randn({n, n}, o), b = at::randn({n, n}, o);  // random data: zeros run faster
  at::Tensor c = at::mm(a, b);
  for (int i = 0; i < 3; ++i) at::mm_out(c, a, b);  // warm-up (clocks, cuBLAS's heuristics)
  synchronize_compute_device();
  // Timed in batches of 10 launches, synchronised after each: the rate of the device, not of the queue.
  const double batches = rate(seconds, [&] {
    for (int i = 0; i < 10; ++i) at::mm_out(c, a, b);
    synchronize_compute_device();
  });
  return 10 * batches * 2.0 * n * n * static_cast<double>(n);
}

double measure_copy_bandwidth(int threads, double seconds, double bytes) {
  Threads guard(threads);
  const at::Tensor src = at::ones({static_cast<int64_t>(bytes / 4)}), dst = at::empty_like(src);
  dst.copy_(src);  // warm-up: pages faulted in
  return 2 * bytes * rate(seconds, [&] { dst.copy_(src); });
}

std::string default_peak_cache() {
  const char* env = std::getenv("MESHTRAIN_CACHE");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path dir = env && *env   ? fs::path(env)
                       : xdg && *xdg ? fs::path(xdg) / "meshtrain"
                       : home        ? fs::path(home) / ".cache" / "meshtrain"
                                     : fs::temp_directory_path() / "meshtrain";
  return (dir / "peaks.json").string();
}

namespace {

nlohmann::json read_cache(const std::string& cache_file) {
  nlohmann::json cache = nlohmann::json::object();
  if (std::ifstream in(cache_file); in) {
    try {
      in >> cache;
    } catch (const nlohmann::json::exception&) {
      cache = nlohmann::json::object();  // unreadable: measured again and rewritten
    }
  }
  return cache.is_object() ? cache : nlohmann::json::object();
}

// The cached entry's value for `key`, 0 if none.
double cached_value(const nlohmann::json& cache, const std::string& key) {
  if (!cache.contains(key) || !cache[key].contains("value") || !cache[key]["value"].is_number()) return 0;
  return cache[key]["value"].get<double>();
}

// Writes `value` as `key`'s best (atomically); false where the cache cannot be written.
bool write_best(nlohmann::json cache, const std::string& key, double value, const std::string& cache_file) {
  const std::time_t now = std::time(nullptr);
  char date[16];
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  cache[key] = {{"value", value}, {"date", date}};
  try {
    fs::create_directories(fs::path(cache_file).parent_path());
    const std::string tmp = cache_file + fmt::format(".tmp{}", getpid());
    std::ofstream(tmp) << cache.dump(2) << "\n";
    fs::rename(tmp, cache_file);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

double cpu_mhz() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("cpu MHz", 0) == 0) return std::atof(line.substr(line.find(':') + 1).c_str());
  }
  return 0;
}

// show_config()'s "BLAS_INFO=..." (mkl, open, ...), with MKL's version where it is MKL.
std::string blas_name() {
  const std::string config = at::show_config();
  const size_t at = config.find("BLAS_INFO=");
  std::string blas = at == std::string::npos ? "unknown" : config.substr(at + 10, config.find_first_of(", \n", at + 10) - at - 10);
  return blas;
}

constexpr const char* kHostPeakEnv = "MESHTRAIN_HOST_GEMM_PEAK";

std::string peak_source(const std::string& what, int cores, double seconds) {
  return fmt::format("{} GEMMs on all {} cores before the ranks started ({:.2f} s); BLAS {}, CPU capability {}",
                     what == "gemm_bf16" ? "bf16" : "fp32", cores, seconds, blas_name(), at::get_cpu_capability());
}

}  // namespace

MachinePeak machine_peak(const std::string& what, int threads, double override_value, const std::string& override_name,
                         const std::string& cache_file) {
  if (override_value > 0) return {override_value, override_name};
  const std::string key = machine_key(what, threads);
  const nlohmann::json cache = read_cache(cache_file);
  // Measured every time and the best kept: a measurement taken while the host was busy (other processes,
  // a parallel build) is low and must not become the machine's peak for good.
  const double now_value = measure(what, threads), best = cached_value(cache, key);
  if (best >= now_value) {
    return {best, fmt::format("the best measured, on {}, cached in {}", cache[key].value("date", "an earlier day"),
                              cache_file)};
  }
  if (write_best(cache, key, now_value, cache_file)) {
    return {now_value, fmt::format("measured now, the best so far, cached in {}", cache_file)};
  }
  return {now_value, "measured now (the cache could not be written)"};
}

std::vector<std::string> gemm_health(const GemmHealthInputs& in) {
  std::vector<std::string> out;
  // One FMA unit of the capability's vector width: 2 FLOPs x fp32 lanes per cycle (AVX2 8 lanes, AVX-512 16).
  const int lanes = in.capability.rfind("AVX512", 0) == 0 ? 16 : in.capability == "AVX2" ? 8 : 4;
  if (in.mhz > 0 && in.fp32_flops > 0) {
    const double per_cycle = in.fp32_flops / (in.cores * in.mhz * 1e6), one_fma = 2.0 * lanes;
    if (per_cycle < 0.25 * one_fma) {
      out.push_back(fmt::format(
          "fp32 GEMMs run at {:.1f} FLOP per cycle per core ({:.1f} GFLOP/s on {} cores at {:.0f} MHz), under a "
          "quarter of the {:.0f} one {} FMA unit allows: the BLAS ({}) runs generic kernels for this CPU. With "
          "OpenBLAS set OPENBLAS_CORETYPE to the CPU's family (SkylakeX, Haswell, Zen); with MKL unset "
          "MKL_ENABLE_INSTRUCTIONS and MKL_DEBUG_CPU_TYPE",
          per_cycle, in.fp32_flops / 1e9, in.cores, in.mhz, one_fma, in.capability, in.blas));
    }
  }
  if (in.bf16_run && in.bf16_flops > 0 && in.fp32_flops > 0 && in.bf16_flops < in.fp32_flops) {
    out.push_back(fmt::format(
        "bf16 GEMMs run at {:.3g}x the fp32 rate here ({:.1f} vs {:.1f} GFLOP/s): this CPU ({}) has no bf16 "
        "matrix instructions (avx512_bf16, amx_bf16); train.precision = \"fp32\" is faster on it",
        in.bf16_flops / in.fp32_flops, in.bf16_flops / 1e9, in.fp32_flops / 1e9, in.capability));
  }
  if (in.cpu_share < kSharedCpuShare) {
    out.push_back(fmt::format(
        "other processes computed on these cores while the GEMM rate was measured: its {} threads ran {:.0f}% of "
        "the time and reached {:.1f} GFLOP/s; the MFU divides by one core's rate per second of its CPU time x {} "
        "cores ({:.1f} GFLOP/s), and this run's tokens/s are those of a shared host",
        in.cores, 100 * in.cpu_share, in.all_core_flops / 1e9, in.cores,
        (in.bf16_run ? in.bf16_flops : in.fp32_flops) / 1e9));
  }
  const double now = in.bf16_run ? in.bf16_flops : in.fp32_flops;
  if (in.cpu_share >= kSharedCpuShare && in.best_flops > 0 && now < kLowRate * in.best_flops) {
    out.push_back(fmt::format(
        "the {} GEMM rate now ({:.1f} GFLOP/s) is {:.2f}x this host's best ({:.1f} GFLOP/s, {}): other processes "
        "are using the cores{}; the run's MFU divides by the rate measured now",
        in.bf16_run ? "bf16" : "fp32", now / 1e9, now / in.best_flops, in.best_flops / 1e9, in.best_date,
        in.probes > 1 ? fmt::format(" (the better of {} probes 0.3 s apart)", in.probes) : ""));
  }
  return out;
}

HostPeak measure_host_peak(const std::string& what, int cores, const std::string& cache_file) {
  if (what != "gemm_fp32" && what != "gemm_bf16") {
    throw std::invalid_argument(fmt::format("host peak '{}': use gemm_fp32 or gemm_bf16", what));
  }
  const auto t0 = std::chrono::steady_clock::now();
  GemmHealthInputs in;
  in.bf16_run = what == "gemm_bf16";
  in.cores = cores;
  const std::string key = machine_key(what, cores);
  nlohmann::json cache = read_cache(cache_file);
  in.best_flops = cached_value(cache, key);
  GemmRate fp32 = measure_gemm_rate(cores, 0.25);
  // A dip of the host can cover the whole 0.25 s probe: on the 2-core EPYC VM, 0.3-2.5 s at about half
  // the rate, after a large process exits and at random (a neighbour's burst), and a run's MFU divided
  // by it read 90% beside 55% for its neighbours. So a fp32 probe under 0.7x this host's best, with
  // its threads not descheduled, is taken once more after a pause, and the faster kept.
  if (!in.bf16_run && in.best_flops > 0 && fp32.cpu_share >= kSharedCpuShare && fp32.flops < kLowRate * in.best_flops) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const GemmRate again = measure_gemm_rate(cores, 0.25);
    if (again.flops > fp32.flops) fp32 = again;
    in.probes = 2;
  }
  in.fp32_flops = fp32.flops;
  // bf16 with 256-wide products: on a CPU without bf16 instructions one 512^3 product can take ~0.2 s.
  if (in.bf16_run) in.bf16_flops = measure_gemm_flops(cores, 0.25, 256, true);
  // Cores shared with another process: its threads ran a fraction of the time, and a GEMM whose
  // threads wait for a descheduled peer loses far more than that fraction (an AMD EPYC's 2 cores
  // beside 3 busy threads: 0.33 of the CPU time, 1/17 of the rate). One core's rate per second of
  // its own CPU time does not depend on the sharing; times the cores it bounds the all-core rate
  // from above, so the run's MFU cannot exceed 100 % because the measurement was unlucky.
  in.cpu_share = fp32.cpu_share;
  const bool shared = fp32.cpu_share < kSharedCpuShare;
  if (shared) {
    in.all_core_flops = in.bf16_run ? in.bf16_flops : in.fp32_flops;
    in.fp32_flops = std::max(in.fp32_flops, cores * measure_core_gemm_flops(0.1));
    if (in.bf16_run) in.bf16_flops = std::max(in.bf16_flops, cores * measure_core_gemm_flops(0.1, 256, true));
  }
  in.mhz = cpu_mhz();
  in.capability = at::get_cpu_capability();
  in.blas = blas_name();
  in.best_date = in.best_flops > 0 ? cache[key].value("date", "an earlier day") : "";
  HostPeak out;
  const double own = in.bf16_run ? in.bf16_flops : in.fp32_flops;  // the run's dtype: what the cache keeps
  // A bf16 run's step is bounded by the faster of the two rates: its GEMMs are bf16 and fp32 (the loss,
  // the optimizer's), and a CPU without bf16 instructions computes bf16 GEMMs by widening to fp32, so
  // there the fp32 rate is the machine's peak. Dividing by the slower bf16 rate alone gave MFU > 1.
  out.value = std::max(own, in.fp32_flops);
  out.warnings = gemm_health(in);
  out.probes = in.probes;
  if (own > in.best_flops && !shared) write_best(cache, key, own, cache_file);  // a bound is no measurement
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.source = peak_source(in.bf16_run && in.fp32_flops > own ? "gemm_fp32" : what, cores, out.seconds);
  if (in.bf16_run && in.fp32_flops > own) out.source += " (faster here than bf16 GEMMs)";
  return out;
}

std::string host_peak_key(const std::string& what, int threads) { return machine_key(what, threads); }

void hand_down_host_peak(const std::string& what, const HostPeak& p, int cores) {
  ::setenv(kHostPeakEnv, fmt::format("{} {:.17g} {:.3f} {} {}", what, p.value, p.seconds, cores, p.source).c_str(), 1);
}

double cached_copy_bandwidth(int cores, const std::string& cache_file) {
  return cached_value(read_cache(cache_file), machine_key("copy", cores));
}

HostPeak mfu_peak(double peak_tflops, bool bf16) {
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string dtype = bf16 ? "bf16" : "fp32";
  HostPeak peak;
  if (peak_tflops > 0) {
    peak.value = peak_tflops * 1e12;
    peak.source = "train.peak_tflops";
  } else if (computes_on_cuda()) {
    peak.value = measure_cuda_gemm_flops(bf16);
    peak.source = fmt::format("{} GEMM rate of {}, measured now", dtype, compute_device_name());
  } else {
    peak = host_peak_from_launcher("gemm_" + dtype);
    if (peak.value <= 0) {
      peak = measure_host_peak("gemm_" + dtype, cores);
      for (const std::string& w : peak.warnings) fmt::print(stderr, "meshtrain: warning: {}\n", w);
      peak.source = fmt::format("{} GEMMs on all {} cores, measured by rank 0 while the others waited ({:.2f} s)",
                                dtype, cores, peak.seconds);
    }
  }
  return peak;
}

HostPeak host_peak_from_launcher(const std::string& what) {
  HostPeak out;
  const char* env = std::getenv(kHostPeakEnv);
  if (!env) return out;
  std::istringstream in(env);
  std::string handed;
  double value = 0, seconds = 0;
  int cores = 0;
  if (!(in >> handed >> value >> seconds >> cores) || handed != what || !(value > 0)) return out;
  out.value = value;
  out.seconds = seconds;
  // The launcher's own words: for a bf16 run on a CPU without bf16 instructions the value is the
  // fp32 rate, and the source says so.
  std::getline(in >> std::ws, out.source);
  if (out.source.empty()) out.source = peak_source(what, cores, seconds);
  return out;
}

}  // namespace meshtrain
