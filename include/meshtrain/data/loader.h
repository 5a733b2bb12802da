// Training windows from token shards, shuffled from a seed, split across
// data-parallel ranks, with a position that is saved and restored exactly.
//
// Each shard of N tokens holds floor((N-1)/seq) windows: window w is tokens
// [w*seq, w*seq + seq] (seq inputs, the same shifted by one as targets); windows
// never cross shards. Epoch e visits the windows in a permutation drawn from
// (seed, e). Every step (one micro-batch) takes the next dp_size * micro_batch
// windows of that order; rank r gets the r-th micro_batch of them, so ranks
// never overlap and together see exactly what one process with the global
// batch would. An epoch holds whole global batches of dp_size * micro_batch *
// accumulation windows, the leftover (fewer than a global batch) skipped: so
// where an epoch ends depends on the global batch alone, not on how it is
// split over ranks and micro-batches, and every mesh starts epoch e+1 at the
// same optimizer step. The state is (epoch, step in epoch): restoring it
// resumes on the very next window, with no repeat and no skip.
//
// With `documents`, each batch also carries the document of every input
// position (from the shards' document starts), numbered 0, 1, ... within its
// window: what a document mask needs so that packed documents do not attend to
// each other and their positions restart (model/transformer.h).
//
// With `loss_masks`, each shard X.bin has a mask shard X.mask.bin beside it
// (data/chat.h: 1 = the token is trained as a target): targets whose mask is 0
// become -1 (ignored: zero loss, zero gradient).
//
// With `repack` (SFT; needs `loss_masks`), the unit is the conversation, not
// the window: the shards' documents that train something (data/chat.h; the
// padding runs are dropped) are shuffled each epoch from (seed, epoch) and
// packed afresh, whole and in that order, into rows of `seq` inputs (a row
// closes when the next conversation does not fit; the rest is padding, mask 0,
// a document of its own). So every epoch sees every conversation once, in a
// new order and new company; micro_batch counts rows, and the steps of an
// epoch follow from its packing (still a pure function of seed and epoch, so
// the state (epoch, step) resumes exactly). Batch::doc_ids numbers each row's
// conversations.
//
// With `group` > 1, windows come in groups of that many consecutive windows
// that stay together (DPO's chosen and rejected sequences of one pair, data/
// preference.h): the permutation is over groups, micro_batch counts groups, and
// a batch holds micro_batch x group rows, each group's windows adjacent.
//
// With several sources (a mixture, data/mixture.h), each slot of the global
// order is filled from the source the blending rule picks, with that
// source's next window in its own order (the options above apply to each
// source; not `repack`). The state's epoch stays 0 and its step counts every
// step; each source's epochs are its own (source_stats()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/data/mixture.h"
#include "meshtrain/data/shard.h"

namespace meshtrain {

struct LoaderState {
  uint64_t epoch = 0;
  uint64_t step = 0;  // steps taken in this epoch
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && step == o.step; }
};

struct Batch {
  at::Tensor tokens;   // [micro_batch, seq] int64
  at::Tensor targets;  // [micro_batch, seq] int64
  std::vector<uint64_t> windows;  // global window ids, for checks
  at::Tensor doc_ids;  // [micro_batch, seq] int64 when the loader gives documents, else undefined
  // The first row's place in its optimizer step's global batch (rows first_row.. of
  // accumulation x dp x micro-batch rows, the same on every mesh): dropout masks are keyed by it.
  int64_t first_row = 0;
};

// `b` on the device this process computes on (platform/device.h): itself on cpu, else a copy
// of its tensors there. The loader reads on the host; steps and evaluations compute here.
Batch on_compute_device(const Batch& b);

struct LoaderOptions {
  bool documents = false;   // Batch::doc_ids from the shards' document starts
  bool loss_masks = false;  // targets masked by X.mask.bin
  int64_t group = 1;        // windows that stay together (2: preference pairs)
  bool repack = false;      // conversations shuffled and packed afresh each epoch
  // Micro-batches per optimizer step: an epoch ends on a whole global batch
  // (dp_size x micro_batch x accumulation units), the same step on every mesh.
  int64_t accumulation = 1;
};

class TokenLoader {
 public:
  // Throws std::invalid_argument when the shards hold fewer windows than one
  // global batch (naming the numbers), or for bad sizes (a shard whose windows
  // are not whole groups among them).
  TokenLoader(const std::vector<std::string>& shards, int64_t seq, int64_t micro_batch, int dp_rank, int dp_size,
              uint64_t seed, LoaderOptions o = {});

  // A mixture: throws std::invalid_argument naming a bad source (check_sources)
  // or a source's data that does not make one window (group) of `seq`.
  TokenLoader(const std::vector<MixtureSource>& sources, int64_t seq, int64_t micro_batch, int dp_rank, int dp_size,
              uint64_t seed, LoaderOptions o = {});
  TokenLoader(TokenLoader&&) = default;

  struct SourceStats {
    std::string name;
    uint64_t taken = 0, windows = 0;  // windows (groups) all ranks have taken from it, and it holds
    double epochs() const { return windows ? static_cast<double>(taken) / static_cast<double>(windows) : 0; }
  };
  // Per source, as of the current state (the same on every rank); empty without a mixture.
  std::vector<SourceStats> source_stats() const;

  // The mask shard beside a token shard: X.bin -> X.mask.bin.
  static std::string mask_path(const std::string& shard);

  Batch next();
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);

  // Windows of the shards (with `repack`: conversations).
  uint64_t windows() const { return repack_ ? convs_.size() : total_windows_; }
  bool mixture() const { return !sources_.empty(); }
  // Steps (micro-batches) of the current epoch: a multiple of the accumulation.
  uint64_t steps_per_epoch() const;

 private:
  void shuffle(uint64_t epoch);
  Batch next_mixed();
  Batch next_unmixed();  // one call of a single source: windows in order, or repacked rows
  // A mixture: one loader per source (micro-batch 1, one rank), the blending rule, source names.
  std::vector<std::unique_ptr<TokenLoader>> sources_;
  std::vector<std::string> source_names_;
  std::unique_ptr<SourceBlend> blend_;
  std::vector<uint64_t> source_first_window_;  // global window ids: each source's after the ones before
  Batch next_repacked(uint64_t base);
  struct Conversation {
    size_t shard;
    uint64_t start, length;
  };
  bool repack_ = false;
  std::vector<Conversation> convs_;
  uint32_t pad_ = 0;  // the shards' closing token: pack_chats' pad
  // With `repack`: rows of the packed epoch `rows_epoch_`, each its conversations.
  mutable uint64_t rows_epoch_ = UINT64_MAX;
  mutable std::vector<std::vector<size_t>> rows_;
  const std::vector<std::vector<size_t>>& rows(uint64_t epoch) const;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<uint64_t> first_window_;  // per shard, its first global window id
  std::vector<std::vector<uint64_t>> doc_starts_;  // per shard, with `documents`
  std::vector<std::unique_ptr<ShardReader>> masks_;  // per shard, with `loss_masks`
  bool documents_ = false;
  uint64_t group_ = 1;
  int64_t seq_, micro_batch_;
  int dp_rank_, dp_size_;
  uint64_t seed_, total_windows_ = 0;
  int64_t accumulation_ = 1;
  LoaderState state_;
  uint64_t order_epoch_ = UINT64_MAX;
  std::vector<uint64_t> order_;  // a permutation of the groups
};

}  // namespace meshtrain
