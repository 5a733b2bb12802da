#include "meshtrain/train/gemm_peak.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <chrono>

namespace meshtrain {

double measure_gemm_flops(int threads, double seconds, int n) {
  // fp32 GEMM runs in OpenBLAS, which keeps its own thread count (PLATFORM.md).
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get_blas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const int before = at::get_num_threads(), blas_before = get_blas ? get_blas() : 0;
  at::set_num_threads(threads);
  if (set_blas) set_blas(threads);
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);  // warm-up
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int64_t calls = 0;
  double dt = 0;
  do {
    at::mm_out(c, a, b);
    ++calls;
    dt = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (dt < seconds);
  at::set_num_threads(before);
  if (set_blas && blas_before > 0) set_blas(blas_before);
  return 2.0 * n * n * static_cast<double>(n) * static_cast<double>(calls) / dt;
}

}  // namespace meshtrain
