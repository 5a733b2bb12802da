// The machine a plan runs on: what the time model (plan/op_time.h) needs to
// know about one accelerator and its links. Plain data, no libtorch.
//
// Every preset's numbers come from a public source named in hardware.cpp:
// peaks and bandwidths from the vendor's data sheet, the fraction of peak a
// large GEMM reaches from a published measurement (Bekman's "maximum
// achievable matmul FLOPS", MAMF), link efficiencies and latencies from a
// published, validated model (Calculon, Isaev et al. SC'23). None is fitted to
// the runs the planner is validated against (tests/test_plan_time.cpp).
#pragma once

#include <string>
#include <vector>

namespace meshtrain::plan {

// One class of link (NVLink inside a node, the NIC between nodes), per GPU per
// direction.
struct LinkSpec {
  double bandwidth = 0;   // bytes/s
  double efficiency = 1;  // fraction of `bandwidth` a large collective's bus bandwidth reaches
  double latency = 0;     // seconds per hop of a ring or tree step
  double gather_cost = 1;          // all-gather / reduce-scatter time over the ring's ideal
  bool switch_all_reduce = false;  // all-reduce reduced in the switch: the buffer crosses once (NVLink SHARP)
  // A collective hidden under compute still takes this fraction of the processor for its time (NCCL's
  // kernels occupy SMs and memory bandwidth): hidden for t seconds, the compute under it runs t x this longer.
  double processor_usage = 0;
  // Across nodes: a group with several members in each node drives that many NICs at once (NCCL runs one
  // ring per NIC), up to the node's own NVLink rate (rail_limit, bytes/s). axis_link sets both.
  int rails = 1;
  double rail_limit = 0;
};

struct GpuSpec {
  std::string name;
  double peak_flops = 0;    // dense 16-bit matrix FLOP/s
  double memory_bytes = 0;  // device memory
  double intra_node_bw = 0;  // bytes/s per GPU per direction (NVLink): intra.bandwidth
  double inter_node_bw = 0;  // bytes/s per GPU per direction (NIC): inter.bandwidth
  int per_node = 8;
  // Time model (plan/op_time.h).
  double matmul_efficiency = 0.8;  // large, well-shaped GEMM: achieved / peak (MAMF)
  int sms = 0;                     // streaming multiprocessors: GEMM tiles run in waves of this many (0: no waves)
  double memory_bw = 0;            // bytes/s of device memory
  double memory_efficiency = 0.9;  // a streaming kernel's share of memory_bw
  double flash_efficiency = 0.6;   // a flash-attention kernel's fraction of peak, forward + backward, long sequences
  // Where measured: the kernel's forward + backward FLOP/s with the causal mask by sequence length (ascending)
  // for head dimensions 64 and 128, FLOPs counted as its benchmark counts them (the causal half of 4 s^2 d per
  // head forward, 2.5x that backward). Empty: flash_efficiency of peak at every shape (plan/op_time.h).
  std::vector<double> flash_seq, flash_d64, flash_d128;
  bool flash_kernels = false;  // flash-style attention kernels exist (FlashAttention-2: Ampere and later)
  double fp8_peak_flops = 0;       // dense fp8 (E4M3/E5M2) matrix FLOP/s; 0: no fp8 tensor cores
  double fp8_matmul_efficiency = 0;  // large fp8 GEMM: achieved / fp8 peak (MAMF)
  LinkSpec intra, inter;
  // The host, for optimizer offload (plan/step_time.h, offload_time): the GPU's PCIe link per direction and
  // the node's host DRAM bandwidth (all sockets, shared by its per_node GPUs' ranks). 0: no host to offload to.
  double pcie_bw = 0;
  double pcie_efficiency = 0.95;  // a large DMA copy's share of pcie_bw
  double host_memory_bw = 0;
  std::string source;  // where the numbers come from, printed with a plan
};

// h100, h200, a100, a100-40g, v100, b200, cpu (a host, its rates measured by `meshtrain plan --gpu cpu`).
const GpuSpec& gpu_preset(const std::string& name);
std::vector<std::string> gpu_preset_names();

// The cpu device as each of `ranks` processes on one host sees it: the host's measured GEMM rate, copy
// bandwidth and memory, shared evenly (the ranks split the cores: meshtrain's launcher gives each
// cores / ranks threads), and all of them on one node (their links are the host's loopback).
GpuSpec cpu_device(double host_gemm_flops, double host_copy_bw, double host_memory_bytes, int ranks);

}  // namespace meshtrain::plan
