#include "meshtrain/data/validation.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <stdexcept>

namespace meshtrain {
namespace {

LoaderOptions one_unit_per_step(LoaderOptions o) {
  o.accumulation = 1;
  return o;
}

}  // namespace

ValidationSet::ValidationSet(const std::vector<std::string>& shards, int64_t seq, int64_t micro_batch, uint64_t seed,
                             LoaderOptions o, uint64_t count, int data_rank, int data_size)
    : order_(shards, seq, 1, 0, 1, seed, one_unit_per_step(o)),
      micro_batch_(micro_batch),
      seq_(seq),
      rows_per_unit_(o.group),
      units_(order_.steps_per_epoch()),
      data_rank_(data_rank),
      data_size_(data_size),
      documents_(o.documents) {
  if (count > units_) {
    throw std::invalid_argument(fmt::format("train.eval_windows = {} is more than the {} the validation data holds at "
                                            "seq {}: lower it (0 = all of them)",
                                            count, units_, seq));
  }
  if (count > 0) units_ = count;
}

uint64_t ValidationSet::calls() const {
  const uint64_t per_call = static_cast<uint64_t>(micro_batch_) * static_cast<uint64_t>(data_size_);
  return (units_ + per_call - 1) / per_call;
}

Batch ValidationSet::batch(uint64_t k) {
  const uint64_t first = (k * static_cast<uint64_t>(data_size_) + static_cast<uint64_t>(data_rank_)) *
                         static_cast<uint64_t>(micro_batch_);
  std::vector<at::Tensor> tokens, targets, docs;
  Batch b;
  int64_t rows = 0;
  for (uint64_t u = first; u < std::min(units_, first + static_cast<uint64_t>(micro_batch_)); ++u) {
    order_.restore({0, u});
    Batch one = order_.next();
    rows += one.tokens.size(0);
    tokens.push_back(one.tokens);
    targets.push_back(one.targets);
    if (one.doc_ids.defined()) docs.push_back(one.doc_ids);
    b.windows.insert(b.windows.end(), one.windows.begin(), one.windows.end());
  }
  // Padding: the rows of the units past the end, which train nothing.
  const int64_t want = rows_per_unit_ * micro_batch_;
  if (rows < want) {
    tokens.push_back(at::zeros({want - rows, seq_}, at::kLong));
    targets.push_back(at::full({want - rows, seq_}, -1, at::kLong));
    if (documents_) docs.push_back(at::zeros({want - rows, seq_}, at::kLong));
  }
  b.tokens = at::cat(tokens, 0);
  b.targets = at::cat(targets, 0);
  if (!docs.empty()) b.doc_ids = at::cat(docs, 0);
  return b;
}

}  // namespace meshtrain
