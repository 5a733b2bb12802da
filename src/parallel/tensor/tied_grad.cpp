#include "meshtrain/parallel/tensor/tied_grad.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace meshtrain {

struct TiedGrad::Slot : torch::CustomClassHolder {
  at::Tensor weight;  // the tied weight (identity only)
  at::Tensor dw;      // offered by the loss's backward, taken by the lookup's
  int64_t merged = 0;
};

TiedGrad::TiedGrad(const at::Tensor& weight) : slot_(c10::make_intrusive<Slot>()) { slot_->weight = weight; }
TiedGrad::TiedGrad(c10::intrusive_ptr<Slot> slot) : slot_(std::move(slot)) {}
TiedGrad::TiedGrad(const TiedGrad& other) = default;
TiedGrad& TiedGrad::operator=(const TiedGrad& other) = default;
TiedGrad::~TiedGrad() = default;

bool TiedGrad::is_for(const at::Tensor& weight) const { return slot_->weight.is_same(weight); }

void TiedGrad::offer(const at::Tensor& dw) const { slot_->dw = dw; }

at::Tensor TiedGrad::take() const { return std::exchange(slot_->dw, at::Tensor()); }

int64_t TiedGrad::merged() const { return slot_->merged; }

void TiedGrad::count_merge() const { ++slot_->merged; }

c10::IValue TiedGrad::to_ivalue() const { return c10::IValue::make_capsule(slot_); }

TiedGrad TiedGrad::from_ivalue(const c10::IValue& v) {
  return TiedGrad(c10::static_intrusive_pointer_cast<Slot>(v.toCapsule()));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TiedLookup : torch::autograd::Function<TiedLookup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                            const TiedGrad* tied) {
    ctx->save_for_backward({indices});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["tied"] = tied->to_ivalue();
    return at::embedding(weight, indices);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0].reshape({-1});
    const at::Tensor& g = grads[0];
    const TiedGrad tied = TiedGrad::from_ivalue(ctx->saved_data["tied"]);
    at::Tensor dw = tied.take();
    // The offered dW must still be what autograd will deliver: held by the weight's input buffer
    // (a second reference besides this one). Another gradient of the weight arriving in between (a
    // second forward through it, summed in one backward) makes the buffer a new sum, out of place
    // since the slot held dW; dW is then this function's alone, and the rows go the usual way.
    if (!dw.defined() || dw.use_count() < 2) {
      return {at::embedding_dense_backward(g, indices, ctx->saved_data["rows"].toInt(), -1, false), at::Tensor(),
              at::Tensor()};
    }
    const at::Tensor rows = g.reshape({-1, g.size(-1)});
    dw.index_add_(0, indices, rows.scalar_type() == dw.scalar_type() ? rows : rows.to(dw.scalar_type()));
    tied.count_merge();
    return {at::Tensor(), at::Tensor(), at::Tensor()};  // the rows are in the loss's dW
  }
};

}  // namespace

at::Tensor tied_lookup(const at::Tensor& weight, const at::Tensor& indices, const TiedGrad& tied) {
  return TiedLookup::apply(weight, indices, &tied);
}

}  // namespace meshtrain
