#include "meshtrain/parallel/tensor/layers.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/tensor/tied_grad.h"

namespace meshtrain {

int TensorParallel::size() const { return comm->size(); }
int TensorParallel::rank() const { return comm->rank(); }

namespace {

// x Wᵀ (+ b) from whichever form the weight has: NF4, FP8 or as it is.
at::Tensor product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& b,
                   const std::shared_ptr<PackedWeight>& packed, const std::shared_ptr<nn::Fp8Linear>& fp8) {
  if (!packed && !fp8) return nn::linear(x, weight, b);
  at::Tensor y = packed ? packed->linear(x) : fp8->forward(x, weight);
  return b.defined() ? y + b : y;
}

}  // namespace

at::Tensor TensorParallel::enter(const at::Tensor& x) const {
  return sequence_parallel ? all_gather_seq(x, *comm, 0) : copy_to_region(x, *comm);
}

at::Tensor TensorParallel::leave(const at::Tensor& partial) const {
  return sequence_parallel ? reduce_scatter_seq(partial, *comm, 0) : reduce_from_region(partial, *comm);
}

ColumnParallelLinear::ColumnParallelLinear(ParamStore& store, const std::string& name, int64_t in, int64_t out,
                                           bool bias, double std, TensorParallel tp)
    : tp_(tp) {
  if (out % tp.size() != 0) {
    throw std::invalid_argument(fmt::format("{}: output size {} is not divisible by tp {}", name, out, tp.size()));
  }
  weight = store.create(name + ".weight", {out, in}, Init::Normal, std, 0);
  if (bias) this->bias = store.create(name + ".bias", {out}, Init::Zeros, 0, 0);
}

// LoRA's term trains only under autograd (GradMode on): evaluation and decoding run without its dropout.
at::Tensor ColumnParallelLinear::forward_entered(const at::Tensor& x, bool add_bias) const {
  const at::Tensor b = add_bias ? bias : at::Tensor();
  at::Tensor y = product(x, weight, b, packed, fp8);
  return delta && delta->active() ? y + delta->delta(x, at::GradMode::is_enabled()) : y;
}

RowParallelLinear::RowParallelLinear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
                                     double std, TensorParallel tp)
    : tp_(tp) {
  if (in % tp.size() != 0) {
    throw std::invalid_argument(fmt::format("{}: input size {} is not divisible by tp {}", name, in, tp.size()));
  }
  weight = store.create(name + ".weight", {out, in}, Init::Normal, std, 1);
  if (bias) this->bias = store.create(name + ".bias", {out}, Init::Zeros, 0, -1, tp.sequence_parallel);
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x, bool add_bias) const {
  at::Tensor partial = product(x, weight, at::Tensor(), packed, fp8);
  if (delta && delta->active()) partial = partial + delta->delta(x, at::GradMode::is_enabled());
  at::Tensor y = tp_.leave(partial);
  return add_bias && bias.defined() ? y + bias : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(ParamStore& store, const std::string& name, int64_t vocab,
                                               int64_t padded_vocab, int64_t hidden, double std, TensorParallel tp)
    : tp_(tp) {
  if (padded_vocab % tp.size() != 0 || padded_vocab < vocab) {
    throw std::invalid_argument(fmt::format("{}: padded vocabulary {} must cover {} and divide by tp {}", name,
                                            padded_vocab, vocab, tp.size()));
  }
  rows_ = padded_vocab / tp.size();
  start_ = static_cast<int64_t>(tp.rank()) * rows_;
  weight = store.create(name + ".weight", {padded_vocab, hidden}, Init::Normal, std, 0, false, vocab);
}

at::Tensor VocabParallelEmbedding::forward(const at::Tensor& tokens, const TiedGrad* tied) const {
  const auto lookup = [&](const at::Tensor& ids) { return tied ? tied_lookup(weight, ids, *tied) : at::embedding(weight, ids); };
  at::Tensor t = tokens.t();  // [s, b]
  at::Tensor out;
  if (tp_.size() == 1) {
    out = lookup(t);
  } else {
    at::Tensor local = t - start_;
    at::Tensor outside = (local < 0).logical_or(local >= rows_);
    at::Tensor rows = lookup(local.masked_fill(outside, 0));
    out = rows.masked_fill(outside.unsqueeze(-1), 0.0);
  }
  return tp_.leave(out);
}

}  // namespace meshtrain
