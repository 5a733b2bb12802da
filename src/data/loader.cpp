#include "meshtrain/data/loader.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "meshtrain/platform/device.h"

namespace meshtrain {

TokenLoader::TokenLoader(const std::vector<std::string>& shards, int64_t seq, int64_t micro_batch, int dp_rank,
                         int dp_size, uint64_t seed, LoaderOptions o)
    : documents_(o.documents), seq_(seq), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed),
      accumulation_(o.accumulation) {
  if (seq < 1 || micro_batch < 1 || o.group < 1 || o.accumulation < 1) {
    throw std::invalid_argument(fmt::format("sequence {}, micro-batch {}, group {} and accumulation {} must be positive",
                                            seq, micro_batch, o.group, o.accumulation));
  }
  group_ = static_cast<uint64_t>(o.group);
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw std::invalid_argument(fmt::format("data-parallel rank {} outside 0..{}", dp_rank, dp_size - 1));
  }
  if (shards.empty()) throw std::invalid_argument("no token shards given");
  for (const auto& path : shards) {
    shards_.push_back(std::make_unique<ShardReader>(path));
    first_window_.push_back(total_windows_);
    const uint64_t windows = (shards_.back()->size() - 1) / static_cast<uint64_t>(seq);
    if (windows % group_ != 0) {
      throw std::invalid_argument(fmt::format("{} holds {} windows of {} tokens, not whole groups of {} (a preference "
                                              "shard holds a chosen and a rejected window per pair: was it written "
                                              "with another seq?)",
                                              path, windows, seq + 1, group_));
    }
    total_windows_ += windows;
    if (documents_) doc_starts_.push_back(shards_.back()->doc_starts());
    if (o.loss_masks) {
      masks_.push_back(std::make_unique<ShardReader>(mask_path(path)));
      if (masks_.back()->size() != shards_.back()->size()) {
        throw std::invalid_argument(fmt::format("{} holds {} tokens but its mask {} holds {}", path,
                                                shards_.back()->size(), mask_path(path), masks_.back()->size()));
      }
    }
  }
  if (o.repack) {
    if (!o.loss_masks || o.group != 1) {
      throw std::invalid_argument("repacking conversations needs loss masks (what trains) and group 1");
    }
    repack_ = true;
    for (size_t sh = 0; sh < shards_.size(); ++sh) {
      const auto starts = shards_[sh]->doc_starts();
      const uint64_t n = shards_[sh]->size();
      pad_ = (*shards_[sh])[n - 1];
      for (size_t d = 0; d < starts.size(); ++d) {
        const uint64_t start = starts[d], end = d + 1 < starts.size() ? starts[d + 1] : n;
        if (end <= start) continue;
        bool trains = false;  // padding runs train nothing
        for (uint64_t i = start; i < end && !trains; ++i) trains = (*masks_[sh])[i] != 0;
        if (!trains) continue;
        if (end - start > static_cast<uint64_t>(seq)) {
          throw std::invalid_argument(fmt::format("{}: a conversation at token {} has {} tokens, more than the sequence "
                                                  "{}; tokenize with --seq {} or more",
                                                  shards_[sh]->path(), start, end - start, seq, end - start));
        }
        convs_.push_back({sh, start, end - start});
      }
    }
  }
  if (steps_per_epoch() == 0) {
    throw std::invalid_argument(fmt::format(
        "the shards hold {} windows of {} tokens{}, fewer than one global batch of {} x {} ranks x {} micro-batches; "
        "use more data, a shorter sequence or a smaller batch",
        total_windows_, seq + 1, group_ > 1 ? fmt::format(" ({} groups of {})", total_windows_ / group_, group_) : "",
        micro_batch, dp_size, accumulation_));
  }
}

TokenLoader::TokenLoader(const std::vector<MixtureSource>& sources, int64_t seq, int64_t micro_batch, int dp_rank,
                         int dp_size, uint64_t seed, LoaderOptions o)
    : documents_(o.documents), seq_(seq), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed) {
  check_sources(sources);
  if (o.repack) throw std::invalid_argument("data.sources mixes windows: set train.repack = false for SFT on a mixture");
  if (micro_batch < 1 || dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw std::invalid_argument(fmt::format("micro-batch {} and data-parallel rank {} of {}", micro_batch, dp_rank,
                                            dp_size));
  }
  group_ = static_cast<uint64_t>(o.group);
  LoaderOptions one = o;
  one.accumulation = 1;  // a source's own epochs: every window of it, one at a time
  std::vector<double> weights;
  for (size_t i = 0; i < sources.size(); ++i) {
    try {
      // Each source's own order: from the seed and the source's index.
      sources_.push_back(std::make_unique<TokenLoader>(sources[i].shards, seq, 1, 0, 1,
                                                       seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL * (i + 1), one));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("data.sources[{}] ({}): {}", i, sources[i].name, e.what()));
    }
    source_first_window_.push_back(total_windows_);
    total_windows_ += sources_.back()->windows();
    source_names_.push_back(sources[i].name);
    weights.push_back(sources[i].weight);
  }
  blend_ = std::make_unique<SourceBlend>(weights);
}

std::vector<TokenLoader::SourceStats> TokenLoader::source_stats() const {
  std::vector<SourceStats> out;
  for (size_t i = 0; i < sources_.size(); ++i) {
    out.push_back({source_names_[i], blend_->taken()[i], sources_[i]->windows() / group_});
  }
  return out;
}

Batch on_compute_device(const Batch& b) {
  const c10::Device d = compute_device();
  if (d.is_cpu()) return b;
  auto to = [d](const at::Tensor& t) { return t.defined() ? t.to(d) : t; };
  Batch out = b;
  out.tokens = to(b.tokens);
  out.targets = to(b.targets);
  out.doc_ids = to(b.doc_ids);
  return out;
}

Batch TokenLoader::next_mixed() {
  const uint64_t global = static_cast<uint64_t>(micro_batch_) * dp_size_;
  const uint64_t first = static_cast<uint64_t>(dp_rank_) * micro_batch_;
  std::vector<at::Tensor> tokens, targets, docs;
  Batch b;
  // Every rank runs the rule over the whole step (its counts are everyone's); it reads only its own slots.
  for (uint64_t j = 0; j < global; ++j) {
    const size_t src = blend_->next();
    if (j < first || j >= first + static_cast<uint64_t>(micro_batch_)) continue;
    TokenLoader& s = *sources_[src];
    const uint64_t k = blend_->taken()[src] - 1, per_epoch = s.steps_per_epoch();  // its k-th unit, from 0
    s.restore({k / per_epoch, k % per_epoch});
    Batch one = s.next();
    tokens.push_back(one.tokens);
    targets.push_back(one.targets);
    if (one.doc_ids.defined()) docs.push_back(one.doc_ids);
    for (uint64_t w : one.windows) b.windows.push_back(source_first_window_[src] + w);
  }
  b.tokens = at::cat(tokens, 0);
  b.targets = at::cat(targets, 0);
  if (!docs.empty()) b.doc_ids = at::cat(docs, 0);
  state_.step += 1;
  return b;
}

uint64_t TokenLoader::steps_per_epoch() const {
  if (mixture()) return UINT64_MAX;  // no epoch of the whole: each source has its own
  const uint64_t units = repack_ ? rows(state_.epoch).size() : total_windows_ / group_;
  const uint64_t acc = static_cast<uint64_t>(accumulation_);
  return units / (static_cast<uint64_t>(micro_batch_) * dp_size_ * acc) * acc;  // whole global batches
}

const std::vector<std::vector<size_t>>& TokenLoader::rows(uint64_t epoch) const {
  if (rows_epoch_ == epoch) return rows_;
  std::vector<size_t> order(convs_.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + epoch);
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
  rows_.clear();
  uint64_t used = 0;
  for (size_t c : order) {
    if (rows_.empty() || used + convs_[c].length > static_cast<uint64_t>(seq_)) {
      rows_.emplace_back();
      used = 0;
    }
    rows_.back().push_back(c);
    used += convs_[c].length;
  }
  rows_epoch_ = epoch;
  return rows_;
}

Batch TokenLoader::next_repacked(uint64_t base) {
  const auto& all = rows(state_.epoch);
  Batch b;
  at::Tensor buf = at::full({micro_batch_, seq_ + 1}, static_cast<int64_t>(pad_), at::kLong);
  at::Tensor mask = at::zeros({micro_batch_, seq_ + 1}, at::kLong);
  at::Tensor docs = at::empty({micro_batch_, seq_ + 1}, at::kLong);
  for (int64_t i = 0; i < micro_batch_; ++i) {
    int64_t at_pos = 0, doc = 0;
    int64_t* id = docs[i].data_ptr<int64_t>();
    for (size_t c : all[base + i]) {
      const Conversation& cv = convs_[c];
      shards_[cv.shard]->read(cv.start, cv.length, buf[i].data_ptr<int64_t>() + at_pos);
      masks_[cv.shard]->read(cv.start, cv.length, mask[i].data_ptr<int64_t>() + at_pos);
      for (uint64_t j = 0; j < cv.length; ++j) id[at_pos + j] = doc;
      at_pos += static_cast<int64_t>(cv.length);
      ++doc;
    }
    for (int64_t j = at_pos; j <= seq_; ++j) id[j] = doc;  // the padding: a document of its own
    b.windows.push_back(base + i);
  }
  if (documents_) b.doc_ids = docs.narrow(1, 0, seq_).clone(at::MemoryFormat::Contiguous);
  b.tokens = buf.narrow(1, 0, seq_).clone(at::MemoryFormat::Contiguous);
  b.targets = buf.narrow(1, 1, seq_).clone(at::MemoryFormat::Contiguous);
  b.targets.masked_fill_(mask.narrow(1, 1, seq_) == 0, -1);
  state_.step += 1;
  return b;
}

void TokenLoader::shuffle(uint64_t epoch) {
  if (order_epoch_ == epoch) return;
  const uint64_t n = total_windows_ / group_;
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + epoch);
  // Fisher-Yates with our own index draw: std::shuffle's use of the engine is
  // implementation-defined, and the order must not change across libraries.
  for (uint64_t i = n - 1; i > 0; --i) std::swap(order_[i], order_[rng() % (i + 1)]);
  order_epoch_ = epoch;
}

Batch TokenLoader::next() {
  Batch b = mixture() ? next_mixed() : next_unmixed();
  // The call just made is the (state_.step - 1)-th of its epoch, and an epoch holds whole optimizer
  // steps of `accumulation` calls: its place in the step, then this rank's in the call.
  const uint64_t call = (state_.step - 1) % static_cast<uint64_t>(accumulation_);
  const uint64_t units = call * static_cast<uint64_t>(micro_batch_) * dp_size_ +
                         static_cast<uint64_t>(dp_rank_) * micro_batch_;
  b.first_row = static_cast<int64_t>(units * group_);
  return b;
}

Batch TokenLoader::next_unmixed() {
  if (state_.step >= steps_per_epoch()) {
    state_.epoch += 1;
    state_.step = 0;
  }
  const uint64_t global = static_cast<uint64_t>(micro_batch_) * dp_size_;
  const uint64_t base = state_.step * global + static_cast<uint64_t>(dp_rank_) * micro_batch_;
  if (repack_) return next_repacked(base);
  shuffle(state_.epoch);
  Batch b;
  const int64_t rows = micro_batch_ * static_cast<int64_t>(group_);
  at::Tensor buf = at::empty({rows, seq_ + 1}, at::kLong);
  if (documents_) b.doc_ids = at::empty({rows, seq_}, at::kLong);
  at::Tensor target_mask = masks_.empty() ? at::Tensor() : at::empty({rows, seq_}, at::kLong);
  for (int64_t i = 0; i < rows; ++i) {
    const uint64_t w = order_[base + i / static_cast<int64_t>(group_)] * group_ + i % static_cast<int64_t>(group_);
    const size_t s = std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1;
    const uint64_t start = (w - first_window_[s]) * seq_;
    shards_[s]->read(start, seq_ + 1, buf[i].data_ptr<int64_t>());
    // Target j is token start + j + 1: its mask.
    if (!masks_.empty()) masks_[s]->read(start + 1, seq_, target_mask[i].data_ptr<int64_t>());
    if (documents_) {
      // Input position j is token start + j: its document is the last start <= it, renumbered from 0.
      const auto& ds = doc_starts_[s];
      auto next = std::upper_bound(ds.begin(), ds.end(), start);  // the first document start after `start`
      int64_t* id = b.doc_ids[i].data_ptr<int64_t>();
      int64_t doc = 0;
      for (int64_t j = 0; j < seq_; ++j) {
        if (next != ds.end() && *next == start + static_cast<uint64_t>(j)) {
          ++doc;
          ++next;
        }
        id[j] = doc;
      }
    }
    b.windows.push_back(w);
  }
  // Copies, not views: with one row both narrows are contiguous already, and
  // masking the targets in place would write into the inputs.
  b.tokens = buf.narrow(1, 0, seq_).clone(at::MemoryFormat::Contiguous);
  b.targets = buf.narrow(1, 1, seq_).clone(at::MemoryFormat::Contiguous);
  if (target_mask.defined()) b.targets.masked_fill_(target_mask == 0, -1);  // not trained: ignored
  state_.step += 1;
  return b;
}

std::string TokenLoader::mask_path(const std::string& shard) {
  const std::string stem = shard.size() > 4 && shard.compare(shard.size() - 4, 4, ".bin") == 0
                               ? shard.substr(0, shard.size() - 4)
                               : shard;
  return stem + ".mask.bin";
}

void TokenLoader::restore(const LoaderState& s) {
  if (mixture()) {
    if (s.epoch != 0) throw std::invalid_argument(fmt::format("a mixture's loader state has epoch 0, not {}", s.epoch));
    // The per-source counts are the rule's over every slot before: replayed.
    blend_->reset();
    const uint64_t slots = s.step * static_cast<uint64_t>(micro_batch_) * dp_size_;
    for (uint64_t j = 0; j < slots; ++j) blend_->next();
    state_ = s;
    return;
  }
  const LoaderState before = state_;
  state_ = s;  // the epoch decides its steps (with repacking)
  if (s.step > steps_per_epoch()) {
    state_ = before;
    throw std::invalid_argument(fmt::format("loader state step {} is beyond the {} steps of an epoch of this data; was "
                                            "it saved with other shards or batch sizes?",
                                            s.step, steps_per_epoch()));
  }
  state_ = s;
}

}  // namespace meshtrain
