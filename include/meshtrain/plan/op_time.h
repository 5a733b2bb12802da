// How long one operation takes on one GPU, and one collective on one link
// class: the time model's primitives (plan/step_time.h adds them up).
//
//   GEMM        FLOPs / (peak x matmul_efficiency x wave utilisation) + bytes / (memory_bw x efficiency):
//               the compute and memory sides of the roofline (Williams, Waterman, Patterson, CACM 2009) added,
//               not overlapped (Calculon's "no_overlap" processing mode, Isaev et al. SC'23, with which it
//               reproduces Korthikanti et al.'s A100 runs): a GEMM with a short k or a thin side pays for its
//               loads and stores. The output's tiles run in waves of one tile per SM, a partly filled last
//               wave costing a whole one (NVIDIA, "Matrix Multiplication Background User's Guide", sec. 3.2
//               wave quantization; 128 x 128 tiles). A large square GEMM lands near 0.8 of peak on an A100,
//               below the best shape's MAMF (0.87): the planner errs slow rather than fast.
//   streaming   bytes / (memory_bw x memory_efficiency): norms, activations, softmax, dropout, the optimizer.
//   collective  ring: all-reduce 2(n-1) steps, all-gather / reduce-scatter / all-to-all (n-1), each step
//               moving bytes/n; a send is one step. Time = steps x latency + bus bytes / (bandwidth x
//               efficiency), bus bytes as nccl-tests count them (2(n-1)/n of the buffer for all-reduce,
//               (n-1)/n for the others). All-reduce takes the better of the ring and a tree (2 log2 n steps of
//               latency, the same bus bandwidth: NCCL's double binary tree, Sanders et al. 2009). The link's
//               gather_cost scales all-gather and reduce-scatter, switch_all_reduce sends an all-reduce's
//               buffer once (plan/hardware.cpp), and a group spanning nodes with g members in each runs g
//               rings over g NICs at once, up to the node's NVLink rate (rails).
#pragma once

#include "meshtrain/plan/hardware.h"

namespace meshtrain::plan {

// C[m x n] = A[m x k] B[k x n], `batch` independent ones; 16-bit operands unless stated.
struct Gemm {
  double m = 0, n = 0, k = 0, batch = 1;
  double flops() const { return 2 * m * n * k * batch; }
};

// The fraction of SMs a GEMM's last-wave-padded tiles keep busy: tiles / (waves x SMs); 1 without SMs.
double wave_utilisation(const Gemm& g, const GpuSpec& gpu);
double gemm_seconds(const Gemm& g, const GpuSpec& gpu, double bytes_per_element = 2);
double memory_seconds(double bytes, const GpuSpec& gpu);
// A flash-attention kernel's FLOP/s (the benchmark's convention, GpuSpec::flash_seq) for blocks of `seq`
// queries and keys at head dimension `head_dim`: the GPU's table, linear in log2(seq) between its points and
// in the head dimension between 64 and 128, held at the ends; without a table, flash_efficiency of peak.
double flash_rate(const GpuSpec& gpu, double seq, double head_dim);

// Bytes/s a ring collective moves per rank on `link`: bandwidth x efficiency, times its rails up to their limit.
double ring_rate(const LinkSpec& link);

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, Send };
// `bytes`: the whole buffer (all-gather: the gathered result; reduce-scatter: the input), `n` ranks.
double collective_seconds(Collective c, double bytes, int n, const LinkSpec& link);

// What a collective of `comm` seconds run under `compute` seconds of work adds to the step: the part that
// does not fit, plus the slowdown of the compute it hides under (hidden x link.processor_usage; Calculon).
double overlap_cost(double comm, double compute, const LinkSpec& link);

}  // namespace meshtrain::plan
