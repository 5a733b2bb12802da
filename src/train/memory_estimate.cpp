#include "meshtrain/train/memory_estimate.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "meshtrain/plan/count.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/run_strategy.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

// What glibc's heap holds beyond the live tensors, per byte of the step's transient tensors.
// A property of the allocator and of libtorch's allocation order, not of the machine. Fitted:
// - scores materialised (naive attention): 0.46-0.73 (gpt-tiny on one rank, seq 32-256, micro-batch
//   1-32; bench/memory.sh, docs/bench-memory.md), 0.82 at seq 128 x micro-batch 64;
// - no scores (sdpa, tiled): 0.28-0.40 (gpt-tiny, 4 layers, hidden 128, seq 128, micro-batch 32 and 64;
//   2026-12-06, AMD EPYC): the [b, heads, s, s] blocks that fragment the heap are never allocated.
constexpr double kHeapSlackScores = 0.6;
constexpr double kHeapSlackNoScores = 0.35;
constexpr double kShmPieceBytes = 32.0 * (1 << 20);  // comm_shm.cpp: the largest piece a collective stages at once

// The ledger's lines that hold a step's transient tensors (the rest is state that lives from step to step).
double transient_bytes(const plan::StageLedger& l) {
  double t = 0;
  for (const char* item : {"activations", "recompute working set", "embedding dropout mask", "logits and head input",
                           "ZeRO-3 gathered units"}) {
    for (const auto& line : l.lines) {
      if (line.item == item && !line.host) t += line.bytes;
    }
  }
  return t;
}

bool shm_on() {
  const char* v = std::getenv("MESHTRAIN_SHM");
  return !(v && std::string(v) == "0");
}

}  // namespace

double MemoryEstimate::added() const {
  double a = 0;
  for (const auto& l : lines) a += l.bytes;
  return a;
}

std::string MemoryEstimate::describe() const {
  std::string out = fmt::format("{} per rank: {} resident at start (measured)", plan::human_bytes(total()),
                                plan::human_bytes(at_start));
  for (const auto& l : lines) {
    if (l.bytes > 0) out += fmt::format(" + {} {}", plan::human_bytes(l.bytes), l.item);
  }
  return out;
}

MemoryEstimate estimate_memory(const TrainConfig& c, int dp, double at_start, double file_at_start, double workspace) {
  plan::Strategy s = strategy_of(c, dp);
  // On the CPU a bf16 (fp16) run keeps fp32 weights, gradients and activations between the autocast regions
  // (norms, softmax and the residual stream stay fp32) and adds autocast's cache of 16-bit weight copies:
  // the fp32 ledger plus those copies.
  const bool autocast = c.precision != "fp32";
  s.precision = plan::Precision::Fp32;
  const plan::StageLedger ledger = plan::memory_ledger(c.model, s, plan::MemoryOptions{0, 0}).peak();
  MemoryEstimate e;
  e.at_start = at_start;
  e.file_at_start = file_at_start;
  const double tensors = ledger.device_total();
  const double e_bytes = 4;
  // This rank's parameters: routed experts (reduced over dp) and the rest (over dp x ep), and the largest
  // ZeRO unit (a layer, the embedding with the positions, or the final norm with the head; tied, one unit).
  const plan::ParamCount pc = plan::count_params(c.model, 128 * c.tp);
  const double embedding = static_cast<double>(pc.embedding) / s.tp + static_cast<double>(pc.positions),
               head = static_cast<double>(pc.final_norm) + static_cast<double>(pc.head) / s.tp;
  double experts = 0, unit = c.model.tied ? embedding + head : std::max(embedding, head);
  for (int64_t i = 0; i < c.model.layers; ++i) {
    experts += static_cast<double>(pc.of(c.model, i).expert) / s.ep / s.pp;
    unit = std::max(unit, pc.of(c.model, i).per_rank(s.tp, s.ep));
  }
  const double dense = ledger.params - experts;
  // DDP all-reduces gradients in flat fp32 buckets of ddp_bucket_mb whose views they are (parallel/data/ddp.h):
  // no memory beyond the ledger's gradients.
  const bool ddp = c.zero == 0;
  // Dense gradients are reduced over dp x cp x ep (train/trainer.cpp).
  const int dense_group = s.dp * s.cp * s.ep;
  const double casts = autocast ? 2 * ledger.params : 0;
  e.tensors = tensors + casts;
  auto add = [&e](std::string item, double bytes) { e.lines.push_back({std::move(item), bytes}); };
  add("tensors (plan ledger)", tensors);
  add("autocast's 16-bit weight copies", casts);
  const double slack = s.flash ? kHeapSlackNoScores : kHeapSlackScores;
  add(fmt::format("allocator (glibc's heap: {} x the step's transient tensors)", slack), slack * transient_bytes(ledger));
  // Shared-memory segments: each rank maps every rank's two buffers and a collective touches its message's
  // pages in each (comm/shm_group.h): size x 2 x the group's largest message.
  double shm = 0;
  if (shm_on()) {
    const double rows = static_cast<double>(c.micro_batch) * static_cast<double>(c.seq) / c.cp;
    const double activations = rows * static_cast<double>(c.model.hidden) * e_bytes;
    const double bucket_cap = static_cast<double>(c.ddp_bucket_mb) * (1 << 20);
    auto group = [&](int size, double message) {
      if (size > 1 && message > 0) shm += size * 2 * std::min(message, kShmPieceBytes);
    };
    // dp x cp x ep: the dense gradients' buckets (DDP) or a unit's flat (ZeRO: reduce-scattered, all-gathered).
    group(dense_group, ddp ? std::min(bucket_cap, 4 * dense) : 4 * unit);
    group(s.tp, activations);                                      // tp: a layer's activations
    group(s.cp, activations);                                      // cp: K/V chunks (at most a layer's input)
    group(s.ep, c.model.top_k * activations / (s.sp ? s.tp : 1));  // ep: the dispatched rows
    group(s.pp, activations / (s.sp ? s.tp : 1));                  // pp: a micro-batch's boundary activations
  }
  add("shared-memory buffers", shm);
  add("BLAS workspace (measured)", workspace);
  return e;
}

double resident_bytes() { return proc_status_bytes("VmRSS"); }
double file_resident_bytes() { return proc_status_bytes("RssFile"); }

double measure_gemm_workspace(const TrainConfig& c) {
  const int64_t tp = c.tp, h = c.model.hidden;
  const int64_t rows = c.micro_batch * c.seq / c.cp;
  const int64_t out = std::max({c.model.ffn / tp, c.model.vocab / tp, 3 * h / tp, int64_t{1}});
  const at::Tensor x = at::ones({rows, h}), w = at::ones({h, out}), g = at::ones({rows, out});
  at::Tensor y = at::ones({rows, out}), dx = at::ones({rows, h}), dw = at::ones({h, out});
  const double before = resident_bytes();
  at::mm_out(y, x, w);
  at::mm_out(dx, g, w.t());
  at::mm_out(dw, x.t(), g);
  return std::max(0.0, resident_bytes() - before);
}

std::string memory_check_line(const MemoryEstimate& e, double peak_resident, double file_resident, double peak_tensors,
                              int64_t step) {
  const double files = std::max(0.0, file_resident - e.file_at_start);
  const double grown = peak_resident - e.at_start - files;
  return fmt::format("memory after step {}: peak resident {} = {} at start + {} libraries' pages first run (shared "
                     "between ranks, reclaimable) + {} (estimated {}: {:.2f}x); tensors at most {} (estimated {}: "
                     "{:.2f}x)",
                     step, plan::human_bytes(peak_resident), plan::human_bytes(e.at_start), plan::human_bytes(files),
                     plan::human_bytes(grown), plan::human_bytes(e.added()), grown > 0 ? e.added() / grown : 0.0,
                     plan::human_bytes(peak_tensors), plan::human_bytes(e.tensors),
                     peak_tensors > 0 ? e.tensors / peak_tensors : 0.0);
}

}  // namespace meshtrain
