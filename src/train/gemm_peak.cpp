#include "meshtrain/train/gemm_peak.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "meshtrain/runtime/device.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

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

double measure_gemm_flops(int threads, double seconds, int n, bool bf16) {
  Threads guard(threads);
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::mm(a, b);  // warm-up
  return 2.0 * n * n * static_cast<double>(n) * rate(seconds, [&] { at::mm_out(c, a, b); });
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

MachinePeak machine_peak(const std::string& what, int threads, double override_value, const std::string& override_name,
                         const std::string& cache_file) {
  if (override_value > 0) return {override_value, override_name};
  const std::string key = machine_key(what, threads);
  nlohmann::json cache = nlohmann::json::object();
  if (std::ifstream in(cache_file); in) {
    try {
      in >> cache;
    } catch (const nlohmann::json::exception&) {
      cache = nlohmann::json::object();  // unreadable: measured again and rewritten
    }
  }
  // Measured every time and the best kept: a measurement taken while the host was busy (other processes,
  // a parallel build) is low and must not become the machine's peak for good.
  const double now_value = measure(what, threads);
  if (cache.is_object() && cache.contains(key) && cache[key].contains("value") && cache[key]["value"].is_number() &&
      cache[key]["value"].get<double>() >= now_value) {
    return {cache[key]["value"].get<double>(),
            fmt::format("the best measured, on {}, cached in {}", cache[key].value("date", "an earlier day"), cache_file)};
  }
  const double value = now_value;
  const std::time_t now = std::time(nullptr);
  char date[16];
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  if (!cache.is_object()) cache = nlohmann::json::object();
  cache[key] = {{"value", value}, {"date", date}};
  try {
    fs::create_directories(fs::path(cache_file).parent_path());
    const std::string tmp = cache_file + fmt::format(".tmp{}", getpid());
    std::ofstream(tmp) << cache.dump(2) << "\n";
    fs::rename(tmp, cache_file);
    return {value, fmt::format("measured now, the best so far, cached in {}", cache_file)};
  } catch (const std::exception&) {
    return {value, "measured now (the cache could not be written)"};
  }
}

}  // namespace meshtrain
