// Machine peaks, measured rather than typed in: the MFU line's denominator
// (`meshtrain train`) and the planner's `cpu` device (`meshtrain plan --gpu
// cpu`). The GEMM rate is square matmuls through ATen (hence the BLAS or
// oneDNN libtorch uses) on all the host's cores, in the run's dtype (fp32, or
// for bf16 runs the faster of bf16 and fp32): the kind of multiplication that dominates a step. The
// copy bandwidth is a large buffer copied over and over.
//
// A training run's MFU divides by measure_host_peak(): the launching process
// measures the run's dtype on all of the host's cores before any rank starts
// (nothing else of the run computing) and hands the value to its ranks through
// the environment (kHostPeakEnv). Where other processes share the cores meanwhile
// (the GEMM threads got under 3/4 of their CPU time), the value is one core's rate per
// second of its CPU time x the cores instead, an upper bound of the all-core rate that
// the sharing does not lower, with a warning. The best value ever measured per machine
// (hostname, CPU model, threads, what) is cached in a JSON file, with its date,
// for the kernel-health check and the planner's `cpu` device, never as a run's
// denominator: a best-ever depends on history.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

// FLOP/s of repeated n x n x n matmuls (fp32, or bf16) on `threads` compute threads for about `seconds`
// (after one warm-up call), ATen and OpenBLAS both set to `threads`; restores both thread counts.
double measure_gemm_flops(int threads, double seconds = 0.3, int n = 512, bool bf16 = false);
struct GemmRate {
  double flops = 0;      // as measure_gemm_flops
  double cpu_share = 1;  // the process's CPU seconds / (wall seconds x threads) meanwhile: < 1 when the cores were shared
};
GemmRate measure_gemm_rate(int threads, double seconds = 0.3, int n = 512, bool bf16 = false);
// One core's FLOP/s per second of the calling thread's CPU time (one compute thread, n x n x n
// matmuls for `seconds` of CPU time): the same whether or not other processes share the core.
double measure_core_gemm_flops(double seconds = 0.1, int n = 512, bool bf16 = false);
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

// Kernel health (issue #44): what a pre-start measurement says about this host's GEMMs.
struct GemmHealthInputs {
  double fp32_flops = 0;  // measured now, all cores (shared cores: one core's rate x cores)
  double bf16_flops = 0;  // measured now (0: not measured)
  int cores = 1;
  double mhz = 0;            // /proc/cpuinfo's clock (0: unknown)
  std::string capability;    // ATen's CPU capability: DEFAULT, AVX2, AVX512, ...
  std::string blas;          // libtorch's BLAS (show_config's BLAS_INFO)
  double best_flops = 0;     // this host's best in the run's dtype, cached (0: none)
  std::string best_date;
  bool bf16_run = false;
  double cpu_share = 1;       // measure_gemm_rate's, for the fp32 GEMMs
  double all_core_flops = 0;  // what the all-core GEMMs reached in the run's dtype, when the cores were shared
  int probes = 1;             // fp32 probes taken (2: the first was under 0.7x the best, measure_host_peak)
};
// One warning per finding, each with its cause and fix: fp32 below a quarter of what one FMA unit
// of the capability allows per cycle (generic BLAS kernels); a bf16 run whose bf16 GEMMs are slower
// than fp32 ones (no bf16 instructions); cores shared during the measurement (cpu_share < 0.75:
// the peak is one core's rate x cores); else the rate now under 0.7x this host's best (busy cores).
std::vector<std::string> gemm_health(const GemmHealthInputs& in);

struct HostPeak {
  double value = 0;      // FLOP/s, the run's dtype, all cores
  double seconds = 0;    // the measurement's own time
  int probes = 1;        // fp32 probes: a second, 0.3 s later, where the first was under 0.7x this host's best
  std::string source;    // for the MFU line
  std::vector<std::string> warnings;
};
// Measures `what` ("gemm_fp32" or "gemm_bf16"; a bf16 run measures fp32 too) on `cores` threads now,
// checks its health, and records the best of `what` in the cache. value: the rate in `what`, except
// that a bf16 run gets the faster of bf16 and fp32 (a step of both kinds of GEMM cannot beat it).
HostPeak measure_host_peak(const std::string& what, int cores, const std::string& cache_file = default_peak_cache());
// The cache's key for `what` on `threads` threads of this host (its name, CPU model and thread count).
std::string host_peak_key(const std::string& what, int threads);
// The launching process hands its measurement to the ranks it starts in the environment
// variable MESHTRAIN_HOST_GEMM_PEAK ("<what> <FLOP/s> <seconds> <cores> <source text>").
void hand_down_host_peak(const std::string& what, const HostPeak& p, int cores);
// What a launching process handed down for `what` (value 0: nothing, or another dtype's).
HostPeak host_peak_from_launcher(const std::string& what);
// This host's copy bandwidth (bytes/s, all cores; the planner's cpu device, plan::cpu_device) as
// `meshtrain plan --gpu cpu` measured and cached it (machine_peak's "copy"); 0 when it never did.
// Never measured by a training run: its 512 MiB of buffers would stay in the heap of the process
// (glibc keeps freed memory under meshtrain's malloc settings) and in the ranks' resident
// high-water mark (inherited through fork and exec), which the memory check reads.
double cached_copy_bandwidth(int cores, const std::string& cache_file = default_peak_cache());

// The MFU denominator of one compute unit, on the rank that prints MFU: `peak_tflops` when given
// (train.peak_tflops); on the CPU what the launching process measured on all of this host's cores
// before any rank started, else (ranks started by srun or another launcher) a measurement now, the
// other ranks waiting; on CUDA this rank's device, measured now. MFU is the run's FLOP/s over the
// sum of what its ranks compute on: every node's host (nodes alike) on the CPU, every rank's device
// on CUDA. Measurement warnings go to stderr.
HostPeak mfu_peak(double peak_tflops, bool bf16);

}  // namespace meshtrain
