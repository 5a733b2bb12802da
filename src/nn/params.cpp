#include "meshtrain/nn/params.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "meshtrain/platform/device.h"

namespace meshtrain {

uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

at::Tensor ParamStore::create(const std::string& name, std::vector<int64_t> full_shape, Init init, double std,
                              int64_t tp_dim, bool sequence_partial, int64_t rows_valid) {
  for (const auto& p : params_) {
    if (p.name == name) throw std::logic_error(fmt::format("parameter '{}' registered twice", name));
  }
  if (tp_dim >= 0 && full_shape[tp_dim] % tp_size_ != 0) {
    throw std::invalid_argument(fmt::format("parameter '{}' of shape [{}]: dim {} ({}) is not divisible by tp {}",
                                            name, fmt::join(full_shape, ", "), tp_dim, full_shape[tp_dim], tp_size_));
  }
  at::Tensor full;
  switch (init) {
    case Init::Zeros: full = at::zeros(full_shape, at::kFloat); break;
    case Init::Ones: full = at::ones(full_shape, at::kFloat); break;
    case Init::Normal: {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ ^ stable_hash(name));
      full = at::normal(0.0, std, full_shape, gen);
      break;
    }
  }
  if (rows_valid >= 0 && rows_valid < full_shape[0]) full.narrow(0, rows_valid, full_shape[0] - rows_valid).zero_();
  // A copy: a slice along dim 0 would be contiguous already and keep the whole tensor's storage alive.
  at::Tensor local = tp_dim >= 0 ? full.chunk(tp_size_, tp_dim)[tp_rank_].clone(at::MemoryFormat::Contiguous) : full;
  // Drawn on the CPU (the same values on every device), kept on the one this process computes on.
  if (!compute_device().is_cpu()) local = local.to(compute_device());
  local.set_requires_grad(true);
  params_.push_back(Param{name, local, std::move(full_shape), tp_dim, sequence_partial && tp_size_ > 1});
  return local;
}

at::Tensor ParamStore::create_experts(const std::string& name, std::vector<int64_t> full_shape, double std, int ep_rank,
                                      int ep_size, bool sequence_partial) {
  if (full_shape.empty() || full_shape[0] % ep_size != 0) {
    throw std::invalid_argument(fmt::format("parameter '{}': {} experts are not divisible by ep {}", name,
                                            full_shape.empty() ? 0 : full_shape[0], ep_size));
  }
  create(name, full_shape, Init::Normal, std, -1, sequence_partial);
  Param& p = params_.back();
  const int64_t n = full_shape[0] / ep_size;
  p.tensor = p.tensor.detach().narrow(0, ep_rank * n, n).clone();
  p.tensor.set_requires_grad(true);
  p.expert = true;
  p.expert_offset = ep_rank * n;
  return p.tensor;
}

const Param& ParamStore::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  throw std::out_of_range(fmt::format("no parameter '{}'", name));
}

int64_t ParamStore::local_numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}

void ParamStore::freeze_first(size_t n) {
  for (size_t i = 0; i < n && i < params_.size(); ++i) {
    params_[i].frozen = true;
    params_[i].tensor.requires_grad_(false);
  }
}

}  // namespace meshtrain
