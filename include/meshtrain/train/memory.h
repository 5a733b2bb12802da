// Per-rank memory of training state, measured from the live tensors, beside
// the ZeRO paper's formulas (Rajbhandari et al., arXiv 1910.02054 sec. 3, with
// K = 12 bytes of optimizer state per parameter for mixed-precision Adam).
//
//   per rank, Ψ parameters, N data-parallel ranks   mixed precision   fp32 (meshtrain's fp32 mode)
//   DDP (no sharding)                               16Ψ = 2+2+12      16Ψ = 4+4+8
//   ZeRO-1 (optimizer states sharded)               4Ψ + 12Ψ/N        8Ψ + 8Ψ/N
//   ZeRO-2 (+ gradients)                            2Ψ + 14Ψ/N        4Ψ + 12Ψ/N
//   ZeRO-3 (+ parameters)                           16Ψ/N             16Ψ/N
// DDP's gradient buckets add 4Ψ (fp32) of communication buffers, listed apart.
// ZeRO pads each flat to a multiple of N (parallel/data/zero.h): a few
// elements more. In stage 3 the gathered units in flight come on top; between
// steps none is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/nn/params.h"

namespace meshtrain {

class AdamW;
class DataParallel;
class ShardedDataParallel;

struct MemoryUse {
  int64_t params = 0, grads = 0, optimizer = 0, buffers = 0;  // bytes
  int64_t frozen = 0;     // of `params`: frozen parameters (a base under adapters)
  int64_t quantized = 0;  // NF4 weights (QLoRA's base linears), not among `params`
  // ZeRO-Offload (parallel/data/zero.h): the host master slices, their gradients and the
  // moments, in host memory and in none of the fields above.
  int64_t host = 0;
  int64_t state() const { return params + quantized + grads + optimizer; }
};

// Bytes of the storage held by this rank's parameters, their gradients (where
// allocated), the optimizer's moments and DDP's buckets (when given); with
// `zero` (null entries skipped), also its shards and their gradients; offloaded
// shards, their gradients and the moments count as `host`. Each storage counts once (ZeRO's parameters and gradients are views of flat buffers).
MemoryUse measure_memory(const std::vector<Param>& params, AdamW& opt, const DataParallel* ddp,
                         const std::vector<ShardedDataParallel*>& zero = {});

// The formula table above for `psi` parameters on `n` ranks, with the
// measured row for this run (`mode`: e.g. "DDP fp32").
std::string memory_table(int64_t psi, int n, const MemoryUse& measured, const std::string& mode);

// A "Key:   123 kB" line of /proc/self/status (VmRSS, VmHWM, RssFile...), in
// bytes; throws std::runtime_error when the line is absent.
double proc_status_bytes(const char* key);

// This process's resident-memory high-water mark (getrusage), in bytes; a
// PeakProbe's reset of the kernel's mark does not lower it.
double peak_rss_bytes();

// The peak resident memory one phase (a checkpoint save or load) adds to the
// process: construction resets the kernel's high-water mark
// (/proc/self/clear_refs "5", Linux >= 4.0) and notes the resident size;
// extra_bytes() = high-water mark since - resident size at construction.
// Measured by the kernel, so it sees every allocation (libtorch's, the
// reader's mapped pages), not only those the code reports. Throws
// std::runtime_error when the kernel refuses the reset.
class PeakProbe {
 public:
  PeakProbe();
  double extra_bytes() const;

 private:
  double start_ = 0;
};

}  // namespace meshtrain
