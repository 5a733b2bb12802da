// The per-rank memory ledger: one line per item, each with its formula.
//
// Sources: ZeRO (Rajbhandari et al., arXiv 1910.02054) for model states;
// Korthikanti et al. (arXiv 2205.05198) for activations: per layer
//   no parallelism            sbh(34 + 5as/h)
//   tensor parallel t         sbh(10 + 24/t + 5as/(ht))
//   + sequence parallel       sbh/t (34 + 5as/h)
//   + selective recompute     the 5as^2b attention-core term dropped
//   full recompute            2sbh per layer (the layer input)
// generalised here to GQA (k, v of g heads), SwiGLU (three f-wide tensors) and
// no dropout (no masks); pipeline stages hold their in-flight micro-batches
// (first stage of 1F1B: p; interleaved x (1 + (p-1)/(pv)); GPipe: m).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/plan/spec.h"
#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

// The fused loss's logits per chunk of rows, at most, unless that is fewer rows than
// fused_loss_chunk_rows' floor (parallel/tensor/fused_cross_entropy.h).
constexpr int64_t kFusedLossChunkBytes = int64_t{64} << 20;

// Rows per chunk of the fused loss for n rows of `hidden` features against a vocabulary
// slice of local_vocab: n split evenly into the fewest chunks of at most max(hidden, the rows
// whose fp32 logits fit kFusedLossChunkBytes) rows. The floor of `hidden` rows: every chunk
// accumulates dW [local_vocab, hidden] (read and written, 8 V h bytes in fp32) against its own
// 6 r V h GEMM flops, 4 / (3 r) bytes per flop; with r >= h that is at most the chunk's own fp32
// logits (4 r V bytes) twice over, and on a GPU (some 300 flops per byte of memory traffic) a
// fixed 64 MiB (130 rows of Llama 3's 128256) would spend several times the chunk's GEMM time
// moving dW.
int64_t fused_loss_chunk_rows(int64_t n, int64_t local_vocab, int64_t hidden);

struct LedgerLine {
  std::string item;
  double bytes = 0;
  std::string formula;
  bool host = false;  // lives in host memory (offload): not in the device total
};

struct StageLedger {
  int stage = 0;
  int64_t layers = 0;
  double params = 0;  // parameters held by one rank of this stage
  std::vector<LedgerLine> lines;
  double device_total() const;
  const LedgerLine& line(const std::string& item) const;  // throws when absent
};

// Bytes of parameters, gradients and optimizer states for `params` parameters
// sharded (ZeRO stage `zero`) over `shard` ranks.
struct ModelStates {
  double params = 0, grads = 0, optimizer = 0, fp8_copies = 0;
  double total() const { return params + grads + optimizer + fp8_copies; }
};
ModelStates model_state_bytes(double params, Precision p, int zero, int shard, bool fp8_transpose = false);

// Activation bytes of one transformer layer for one micro-batch on one rank:
// layer `layer` (a MoE or a dense layer), or without it a MoE layer when the
// model has them.
double layer_activation_bytes(const ModelSpec& m, const Strategy& s);
double layer_activation_bytes(const ModelSpec& m, const Strategy& s, int64_t layer);

struct MemoryOptions {
  double reserve_fixed = 1.0 * (1 << 30);  // CUDA context, communicator buffers
  double reserve_fraction = 0.05;          // allocator fragmentation
};

// Ledgers of the first and the last pipeline stage (the same when pp = 1);
// the most loaded rank is one of them.
struct MemoryPlan {
  StageLedger first, last;
  const StageLedger& peak() const { return first.device_total() >= last.device_total() ? first : last; }
};
MemoryPlan memory_ledger(const ModelSpec& m, const Strategy& s, const MemoryOptions& o = {});
// The ledger's last line, never hidden: a fixed reserve plus a fraction of the `used` bytes above it.
LedgerLine reserve_line(double used, const MemoryOptions& o = {});

std::string format_ledger(const StageLedger& l);
std::string human_bytes(double bytes);

}  // namespace meshtrain::plan
