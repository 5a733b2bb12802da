#include "meshtrain/train/fp8_training.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/platform/device.h"

namespace meshtrain {
namespace {

std::string history_name(const std::string& linear) { return "fp8/" + linear + ".amax_history"; }

}  // namespace

Fp8Training::Fp8Training(nn::Fp8Recipe r, const std::vector<Transformer*>& chunks, Comm& tp, Comm& cp)
    : recipe_(r) {
  for (Transformer* m : chunks) {
    Transformer::Linears l = m->linears();
    auto attach = [&](const std::string& name, auto* layer) {
      layer->fp8 = std::make_shared<nn::Fp8Linear>(r, std::vector<Comm*>{&tp, &cp}, compute_device());
      linears_.emplace_back(name, layer->fp8);
    };
    for (auto& [name, layer] : l.column) attach(name, layer);
    for (auto& [name, layer] : l.row) attach(name, layer);
  }
}

void Fp8Training::end_step(Comm& tp, Comm& replicas) {
  if (recipe_.scaling != nn::Fp8Scaling::Delayed || linears_.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> rows;
  for (const auto& [name, l] : linears_) rows.push_back(l->step_amax());
  at::Tensor amax = at::stack(rows);  // [linears, 3]: one reduction per group for all of them
  if (tp.size() > 1) tp.all_reduce(amax, ReduceOp::Max);
  if (replicas.size() > 1) replicas.all_reduce(amax, ReduceOp::Max);
  for (size_t i = 0; i < linears_.size(); ++i) linears_[i].second->push(amax[static_cast<int64_t>(i)]);
}

int64_t Fp8Training::weight_copy_bytes() const {
  int64_t n = 0;
  for (const auto& [name, l] : linears_) n += l->weight_copy_bytes();
  return n;
}

std::vector<ckpt::Piece> Fp8Training::pieces(bool owner) const {
  std::vector<ckpt::Piece> out;
  if (recipe_.scaling != nn::Fp8Scaling::Delayed) return out;
  for (const auto& [name, l] : linears_) {
    if (!l->has_history()) continue;  // saved before the first step: nothing to keep
    const at::Tensor h = l->history().to(at::kCPU);
    out.push_back({history_name(name), h, h.sizes().vec(), {0, 0}, owner});
  }
  return out;
}

void Fp8Training::load(ckpt::Reader& r) {
  if (recipe_.scaling != nn::Fp8Scaling::Delayed) return;
  for (const auto& [name, l] : linears_) {
    if (r.has(history_name(name))) l->restore(r.read_full(history_name(name)).to(l->history().device()));
  }
}

}  // namespace meshtrain
