#include "meshtrain/plan/hardware.h"

#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meshtrain::plan {

namespace {

// Sources of the presets' numbers:
//  [DS]   NVIDIA data sheets: A100 (nvidia-a100-datasheet-us-nvidia-1758950-r4), H100 / H200 (Hopper data
//         sheets), B200 (HGX B200), V100 (Tesla V100 data sheet): dense 16-bit tensor peak, memory size and
//         bandwidth, NVLink bandwidth (the data sheets give both directions together; here one direction);
//         SM counts from the architecture white papers (GA100 108, GH100 SXM5 132, GB200 148, GV100 80).
//  [NIC]  DGX systems: one NIC per GPU: DGX-1 V100 EDR 100 Gb/s, DGX A100 HDR 200 Gb/s, DGX H100/H200 and
//         B200 NDR 400 Gb/s.
//  [MAMF] S. Bekman, Machine Learning Engineering (github.com/stas00/ml-engineering, commit 744d01e),
//         compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table" (bf16 matmul,
//         best shape, mean of 100 runs): A100 SXM 271.2 of 312, H100 SXM 794.5 of 989 ("H200 is the same"),
//         B200 SXM 1745.0 of 2250. No V100 entry: the A100's fraction is assumed. Its FP8 (float8_e4m3fn)
//         table: H100 SXM 1402.6 of 1979, H200 SXM 1453.4 of 1979, B200 SXM 3432.5 of 4500 (the data sheets'
//         dense fp8 peaks); A100 and V100 have no fp8 tensor cores.
//  [CAL]  Calculon (Isaev et al., SC'23; calculon-ai/calculon commit f50f3a4, systems/a100_80g.json,
//         h100_80g_nvl8.json): NVLink collectives at 0.6 of link bandwidth with 1 us per step, the NIC at 0.9
//         with 2 us; streaming memory kernels at 0.9 of memory bandwidth (transfers of 100 MB and more). Its
//         "ops" factors: on NVLink, all-gather and reduce-scatter take 1.5x their ideal ring time (A100 and
//         H100), and the H100's all-reduce moves the buffer once (NVLink SHARP in the NVSwitch); on the NIC, the
//         ring's ideal. Its "processor_usage": a collective overlapped with compute slows that compute by 0.15
//         of the collective's time on NVLink, 0.02 on the NIC (calculon/megatron/layers.py,
//         compute_processing_time: hidden communication adds net_time x processor_usage).
//  [PCIE] The GPUs' data sheets: V100 SXM2 PCIe Gen3 32 GB/s, A100 SXM4 Gen4 64 GB/s, H100 / H200 SXM and B200
//         Gen5 128 GB/s, both directions together (here one direction). Calculon's host tier (its "mem2" for
//         the A100) reaches 0.95 of it on transfers of 100 MB and more.
//  [HOST] The DGX data sheets' CPUs and their vendors' memory specifications (channels x transfer rate x 8
//         bytes, per socket, two sockets): DGX-1 2x Xeon E5-2698 v4 (4 x DDR4-2400: 76.8 GB/s), DGX A100 2x
//         EPYC 7742 (8 x DDR4-3200: 204.8 GB/s), DGX H100 / H200 2x Xeon Platinum 8480C (8 x DDR5-4800: 307.2
//         GB/s), DGX B200 2x Xeon Platinum 8570 (8 x DDR5-5600: 358.4 GB/s). A host pass is assumed to reach
//         the same 0.9 of it as a device pass ([CAL]'s streaming fraction); no published CPU measurement used.
//  [FA2]  Dao, FlashAttention-2 (arXiv 2307.08691), its benchmark as published in Dao-AILab/flash-attention
//         assets/flash2_a100_fwd_bwd_benchmark.png and flash2_h100_fwd_bwd_benchmark.png, panels (c) and (d):
//         forward + backward with the causal mask, TFLOP/s at sequence 512, 1k, 2k, 4k, 8k, 16k for head
//         dimensions 64 and 128 (the flash tables below). Without a table: 0.6 of peak (the paper's 50-73%).
//         FlashAttention-3 (Shah et al., arXiv 2407.08608; assets/flash3_fp16_fwd.png) and cuDNN run the H100's
//         forward up to 1.9x faster than FA2, but no backward of theirs is published there: Hopper uses FA2's
//         measurement, a lower bound for those kernels. B200 has no table of that kind and keeps 0.55 of
//         peak, which the one published forward + backward pair on it supports: FlashAttention-4 (Dao-AILab/
//         flash-attention pull request 2280, 2026-02-27), causal, head dimension 128, sequence 8192, batch 4,
//         16 heads: forward 0.775 ms (1418 TFLOP/s), backward 2.274 ms (1209 TFLOP/s, the 2-CTA path it
//         enables) or 2.459 ms (1118, 1-CTA); with the backward's 2.5x the forward's flops that is 1262 TFLOP/s
//         (0.56 of 2250) or 1190 (0.53). FlashAttention-4's paper (arXiv 2603.05451) reports its forward up to
//         1.3x cuDNN 9.13's, so runs on that cuDNN may sit below 0.55; no cuDNN backward on B200 is published.
// [DS] bandwidth; [CAL] efficiency, latency, the gather factor and the processor usage; NVLink SHARP from the
// NVSwitch generation.
constexpr LinkSpec kNvLink(double bw, bool sharp) { return {bw, 0.6, 1e-6, 1.5, sharp, 0.15}; }
constexpr LinkSpec kNic(double bw) { return {bw, 0.9, 2e-6, 1, false, 0.02}; }  // [NIC] bandwidth, [CAL] the rest

GpuSpec gpu(std::string name, double peak, double mem, double mem_bw, int sms, double mamf, double flash,
            LinkSpec intra, LinkSpec inter, std::string source) {
  GpuSpec g;
  g.name = std::move(name);
  g.peak_flops = peak;
  g.memory_bytes = mem;
  g.memory_bw = mem_bw;
  g.sms = sms;
  g.matmul_efficiency = mamf;
  g.flash_efficiency = flash;
  g.intra = intra;
  g.inter = inter;
  g.intra_node_bw = intra.bandwidth;
  g.inter_node_bw = inter.bandwidth;
  g.source = std::move(source);
  return g;
}

std::map<std::string, GpuSpec> make_presets() {
  std::map<std::string, GpuSpec> p;
  auto add = [&](GpuSpec g) { p[g.name] = g; };
  const std::string nv = "NVIDIA data sheet; MAMF (Bekman); links as Calculon (SC'23)";
  add(gpu("a100", 312e12, 80e9, 2039e9, 108, 271.2 / 312, 0.6, kNvLink(300e9, false), kNic(25e9), nv));
  add(gpu("a100-40g", 312e12, 40e9, 1555e9, 108, 271.2 / 312, 0.6, kNvLink(300e9, false), kNic(25e9), nv));
  add(gpu("h100", 989e12, 80e9, 3350e9, 132, 794.5 / 989, 0.55, kNvLink(450e9, true), kNic(50e9), nv));
  add(gpu("h200", 989e12, 141e9, 4800e9, 132, 794.5 / 989, 0.55, kNvLink(450e9, true), kNic(50e9), nv));
  add(gpu("b200", 2250e12, 192e9, 8000e9, 148, 1745.0 / 2250, 0.55, kNvLink(900e9, true), kNic(50e9), nv));
  for (auto [name, fp8, mamf] : {std::tuple{"h100", 1979e12, 1402.6e12}, {"h200", 1979e12, 1453.4e12},
                                 {"b200", 4500e12, 3432.5e12}}) {
    p[name].fp8_peak_flops = fp8;
    p[name].fp8_matmul_efficiency = mamf / fp8;
  }
  add(gpu("v100", 125e12, 32e9, 900e9, 80, 271.2 / 312, 0.6, kNvLink(150e9, false), kNic(12.5e9),
          "NVIDIA data sheet; MAMF of the A100 assumed (none published)"));
  // FlashAttention-2 runs on Ampere and later (its README); FA3 / cuDNN on Hopper and Blackwell.
  for (const char* name : {"a100", "a100-40g", "h100", "h200", "b200"}) p[name].flash_kernels = true;
  // [FA2] measured forward + backward, causal, TFLOP/s (H200: the H100's).
  const std::vector<double> seqs = {512, 1024, 2048, 4096, 8192, 16384};
  auto tflops = [](std::vector<double> v) {
    for (double& x : v) x *= 1e12;
    return v;
  };
  for (auto [name, d64, d128] :
       {std::tuple{"a100", std::vector<double>{88, 119, 140, 156, 165, 171}, std::vector<double>{99, 133, 155, 173, 182, 189}},
        {"a100-40g", {88, 119, 140, 156, 165, 171}, {99, 133, 155, 173, 182, 189}},
        {"h100", {141, 192, 232, 257, 273, 284}, {163, 221, 265, 294, 308, 328}},
        {"h200", {141, 192, 232, 257, 273, 284}, {163, 221, 265, 294, 308, 328}}}) {
    p[name].flash_seq = seqs;
    p[name].flash_d64 = tflops(d64);
    p[name].flash_d128 = tflops(d128);
  }
  // [PCIE] one direction, [HOST] both sockets.
  for (auto [name, pcie, host] : {std::tuple{"v100", 16e9, 2 * 76.8e9}, {"a100", 32e9, 2 * 204.8e9},
                                  {"a100-40g", 32e9, 2 * 204.8e9}, {"h100", 64e9, 2 * 307.2e9},
                                  {"h200", 64e9, 2 * 307.2e9}, {"b200", 64e9, 2 * 358.4e9}}) {
    p[name].pcie_bw = pcie;
    p[name].host_memory_bw = host;
  }
  // The host itself: no peak, memory or bandwidth here; `meshtrain plan --gpu cpu` measures its GEMM rate and
  // copy bandwidth and reads its memory (cli/cmd_plan.cpp, train/gemm_peak.h). Its links: Gloo over loopback,
  // 1.0 GB/s all-reduce bus bandwidth on 2 ranks as measured for PLATFORM.md (20 us a step).
  GpuSpec cpu = gpu("cpu", 0, 0, 0, 0, 1.0, 0.5, {1e9, 1.0, 20e-6}, {1e9, 1.0, 20e-6},
                    "this host, measured; links as PLATFORM.md measured them");
  cpu.per_node = 4;
  // ATen's CPU flash-attention kernel (scaled_dot_product_attention), which meshtrain's attention = "auto" runs
  // wherever it computes the case (plan::attention_sdpa): the scores are never materialised.
  cpu.flash_kernels = true;
  add(cpu);
  return p;
}

const std::map<std::string, GpuSpec>& presets() {
  static const std::map<std::string, GpuSpec> p = make_presets();
  return p;
}

}  // namespace

GpuSpec cpu_device(double host_gemm_flops, double host_copy_bw, double host_memory_bytes, int ranks) {
  if (ranks < 1) throw std::invalid_argument(fmt::format("{} ranks on a host: at least 1", ranks));
  GpuSpec g = gpu_preset("cpu");
  g.peak_flops = host_gemm_flops / ranks;
  g.memory_bw = host_copy_bw / ranks;
  g.memory_bytes = host_memory_bytes / ranks;
  g.per_node = ranks;
  return g;
}

const GpuSpec& gpu_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    throw std::invalid_argument(fmt::format("unknown gpu '{}'; known: {}", name, fmt::join(gpu_preset_names(), ", ")));
  }
  return it->second;
}

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

}  // namespace meshtrain::plan
