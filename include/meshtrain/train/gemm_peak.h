// Machine peaks, measured rather than typed in: the MFU line's denominator
// (`meshtrain train`) and the planner's `cpu` device (`meshtrain plan --gpu
// cpu`). The GEMM rate is square matmuls through ATen (hence the BLAS or
// oneDNN libtorch uses) on all the host's cores, in the run's dtype (fp32, or
// bf16 for bf16 runs): the kind of multiplication that dominates a step. The
// copy bandwidth is a large buffer copied over and over.
//
// Each start measures again (0.3 s) and the best value is cached per machine
// (hostname, CPU model, threads, what) in a JSON file, with its date: a run on
// a busy host divides by the machine's best, not by what it got that moment.
// Delete the file (or give train.peak_tflops) to change it.
#pragma once

#include <string>

namespace meshtrain {

// FLOP/s of repeated n x n x n matmuls (fp32, or bf16) on `threads` compute threads for about `seconds`
// (after one warm-up call), ATen and OpenBLAS both set to `threads`; restores both thread counts.
double measure_gemm_flops(int threads, double seconds = 0.3, int n = 512, bool bf16 = false);
// FLOP/s of n x n x n matmuls on the CUDA device this process computes on (random data,
// after warm-up; what = "cuda_gemm_fp32" | "cuda_gemm_bf16" for machine_peak).
double measure_cuda_gemm_flops(bool bf16, double seconds = 0.5, int n = 8192);
// Bytes read and written per second copying a `bytes` buffer on `threads` threads.
double measure_copy_bandwidth(int threads, double seconds = 0.3, double bytes = 256.0 * (1 << 20));

struct MachinePeak {
  double value = 0;
  std::string source;  // where it came from, for the log line
};

// $MESHTRAIN_CACHE, else $XDG_CACHE_HOME/meshtrain, else ~/.cache/meshtrain; the file peaks.json in it.
std::string default_peak_cache();

// `what`: "gemm_fp32", "gemm_bf16" or "copy". override_value > 0: it, from `override_name`; else the larger
// of a measurement now and the cache file's entry for this machine, the cache updated when now is larger
// (atomically; a cache that cannot be written is skipped).
MachinePeak machine_peak(const std::string& what, int threads, double override_value = 0,
                         const std::string& override_name = "", const std::string& cache_file = default_peak_cache());

}  // namespace meshtrain
