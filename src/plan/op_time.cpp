#include "meshtrain/plan/op_time.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::plan {

namespace {
constexpr double kTile = 128;  // output tile edge (NVIDIA's GEMM guide; cuBLAS's smallest full-rate tile)
}  // namespace

double wave_utilisation(const Gemm& g, const GpuSpec& gpu) {
  if (gpu.sms <= 0) return 1;
  const double tiles = std::ceil(g.m / kTile) * std::ceil(g.n / kTile) * g.batch;
  const double waves = std::ceil(tiles / gpu.sms);
  return tiles / (waves * gpu.sms);
}

double gemm_seconds(const Gemm& g, const GpuSpec& gpu, double bytes_per_element) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return 0;
  const double compute = g.flops() / (gpu.peak_flops * gpu.matmul_efficiency * wave_utilisation(g, gpu));
  const double bytes = bytes_per_element * g.batch * (g.m * g.k + g.k * g.n + g.m * g.n);
  return compute + memory_seconds(bytes, gpu);
}

double memory_seconds(double bytes, const GpuSpec& gpu) {
  return bytes > 0 ? bytes / (gpu.memory_bw * gpu.memory_efficiency) : 0;
}

double flash_rate(const GpuSpec& gpu, double seq, double head_dim) {
  const std::vector<double>& at = gpu.flash_seq;
  if (at.empty()) return gpu.peak_flops * gpu.flash_efficiency;
  auto along_seq = [&](const std::vector<double>& rate) {
    if (seq <= at.front()) return rate.front();
    if (seq >= at.back()) return rate.back();
    size_t i = 1;
    while (at[i] < seq) ++i;
    const double f = std::log2(seq / at[i - 1]) / std::log2(at[i] / at[i - 1]);
    return rate[i - 1] + f * (rate[i] - rate[i - 1]);
  };
  const double f = std::clamp((head_dim - 64) / 64, 0.0, 1.0);
  return (1 - f) * along_seq(gpu.flash_d64) + f * along_seq(gpu.flash_d128);
}

double ring_rate(const LinkSpec& link) {
  const double rate = link.bandwidth * link.efficiency;
  return link.rails > 1 ? std::min(rate * link.rails, link.rail_limit) : rate;
}

double collective_seconds(Collective c, double bytes, int n, const LinkSpec& link) {
  if (bytes <= 0) return 0;
  const double rate = link.bandwidth * link.efficiency;
  if (c == Collective::Send) return link.latency + bytes / rate;
  if (n <= 1) return 0;
  const double frac = (n - 1.0) / n;
  // Ring collectives run one ring per rail; an all-to-all's traffic leaves through each rank's own NIC.
  const double rings = ring_rate(link);
  switch (c) {
    case Collective::AllReduce: {
      const double wire = (link.switch_all_reduce ? 1 : 2 * frac) * bytes / rings;
      const double ring = 2 * (n - 1) * link.latency, tree = 2 * std::ceil(std::log2(n)) * link.latency;
      return std::min(ring, tree) + wire;
    }
    case Collective::AllGather:
    case Collective::ReduceScatter: return (n - 1) * link.latency + link.gather_cost * frac * bytes / rings;
    case Collective::AllToAll: return (n - 1) * link.latency + frac * bytes / rate;
    case Collective::Send: break;
  }
  return 0;
}

double overlap_cost(double comm, double compute, const LinkSpec& link) {
  const double hidden = std::clamp(compute, 0.0, std::max(comm, 0.0));
  return comm - hidden + hidden * link.processor_usage;
}

}  // namespace meshtrain::plan
