#include "meshtrain/parallel/context/zigzag.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "meshtrain/data/loader.h"

namespace meshtrain {

ZigZag::ZigZag(int64_t seq, int cp, int rank) : cp_(cp), rank_(rank), seq_(seq), chunk_(0) {
  if (cp < 1 || rank < 0 || rank >= cp) throw std::invalid_argument(fmt::format("zig-zag: rank {} of cp {}", rank, cp));
  if (seq % (2 * cp) != 0) {
    throw std::invalid_argument(fmt::format("context parallelism: sequence {} is not divisible by 2 x cp = {}; "
                                            "choose a multiple of {}",
                                            seq, 2 * cp, 2 * cp));
  }
  chunk_ = seq / (2 * cp);
}

namespace {
at::Tensor positions_of(const ZigZag& z, int r) {
  const auto [a, b] = z.chunks_of(r);
  auto opt = at::TensorOptions().dtype(at::kLong);
  return at::cat({at::arange(a * z.chunk(), (a + 1) * z.chunk(), opt), at::arange(b * z.chunk(), (b + 1) * z.chunk(), opt)});
}
}  // namespace

at::Tensor ZigZag::positions() const { return positions_of(*this, rank_); }

at::Tensor ZigZag::shard(const at::Tensor& x, int64_t dim) const {
  if (x.size(dim) != seq_) {
    throw std::invalid_argument(fmt::format("zig-zag shard: dimension {} has {} tokens, not the sequence's {}", dim,
                                            x.size(dim), seq_));
  }
  if (cp_ == 1) return x;
  const auto [a, b] = chunks_of(rank_);
  return at::cat({x.narrow(dim, a * chunk_, chunk_), x.narrow(dim, b * chunk_, chunk_)}, dim);
}

at::Tensor ZigZag::rank_major_order() const {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < cp_; ++r) parts.push_back(positions_of(*this, r));
  return at::cat(parts);  // entry i: the sequence position of rank-major token i
}

at::Tensor ZigZag::natural_order() const { return at::argsort(rank_major_order()); }

Batch context_shard(const Batch& b, const ZigZag& z) {
  Batch out = b;
  out.tokens = z.shard(b.tokens, 1).contiguous();
  out.targets = z.shard(b.targets, 1).contiguous();
  if (b.doc_ids.defined()) out.doc_ids = z.shard(b.doc_ids, 1).contiguous();
  return out;
}

}  // namespace meshtrain
