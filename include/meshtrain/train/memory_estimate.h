// One rank's peak resident memory on the CPU: estimated before the first step,
// checked against the kernel's high-water mark after it.
//
//   peak = resident at start                 measured: libraries, runtime, communicators
//        + tensors                           the plan's ledger (plan/memory.h): parameters,
//                                            gradients, optimizer states, activations, logits
//        + DDP buckets                       the flat copy of the gradients DDP all-reduces
//        + autocast's weight copies          bf16/fp16 runs: 16-bit copies of the weights
//        + allocator                         what glibc's heap holds beyond the live tensors (below)
//        + shared-memory buffers             pages of the ranks' segments a collective touches
//        + BLAS workspace                    measured: the first GEMMs' per-thread buffers
//
// The allocator line: libtorch's CPU allocator takes its storage from glibc's
// malloc, and each rank runs with glibc's mmap off and its trimming at 64 GiB
// (platform/threads.h: freed buffers stay in the heap, 1.5-4x faster steps,
// PLATFORM.md), so every tensor comes from the heap and the heap keeps freed
// blocks that later requests of other sizes cannot reuse. Measured with the
// counting allocator (platform/tensor_memory.h): the heap holds about 0.6x the
// step's transient tensors (activations, logits) beyond the live ones
// (bench/memory.sh, docs/bench-memory.md: 0.46-0.73 on one rank over seq
// 32-256 and micro-batch 1-32; less under ZeRO, more under recomputation,
// pipelining and context parallelism). Returning memory to the kernel instead
// (glibc.malloc.mmap_threshold=131072) costs 30-40% of the step rate here.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

struct TrainConfig;

struct MemoryEstimate {
  struct Line {
    std::string item;
    double bytes = 0;
  };
  double at_start = 0;       // resident bytes at the start point (measured)
  double file_at_start = 0;  // of them, file-backed (the libraries' code and data, mapped files)
  double tensors = 0;       // what the counting allocator should see at its peak: ledger + buckets
  std::vector<Line> lines;  // what the run adds above the start point
  double added() const;     // sum of lines
  double total() const { return at_start + added(); }
  std::string describe() const;  // "X per rank: S resident at start + T tensors (plan ledger) + ..."
};

// The estimate for one rank of `c` on `dp` data-parallel replicas (dp x ep), on
// the CPU. `at_start`, `file_at_start`: resident bytes measured at the start
// point, all and file-backed; `workspace`: what measure_gemm_workspace() found
// right after it.
MemoryEstimate estimate_memory(const TrainConfig& c, int dp, double at_start, double file_at_start, double workspace);

// Resident bytes the first GEMMs of the run's shapes add on this rank's
// threads (BLAS's packing buffers, the thread pool's stacks), measured by
// running them: the forward [rows x hidden] x [hidden x out] and its two
// backward products for the widest `out` of the model's matmuls (rows =
// micro_batch x seq / cp tokens).
double measure_gemm_workspace(const TrainConfig& c);

// This process's resident bytes now (VmRSS), and of them those backed by files (RssFile).
double resident_bytes();
double file_resident_bytes();

// The check after the first steps, one line: the peak resident bytes (the
// kernel's high-water mark) above the start point, less the file-backed pages
// the steps added (the libraries' code that first ran: clean pages the page
// cache shares between the ranks and can drop, not memory a rank allocates),
// against the estimate's lines; and the counting allocator's peak against the
// tensors the estimate expects. The file pages are read now, not at the
// peak: the code first run after the peak (the optimizer's) is subtracted too,
// so the measured side is low by at most that.
std::string memory_check_line(const MemoryEstimate& e, double peak_resident, double file_resident, double peak_tensors,
                              int64_t step);

}  // namespace meshtrain
