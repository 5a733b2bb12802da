// A tied output layer's weight gradient and its embedding's, summed in place.
//
// With the head tied to the embedding (GPT-2's wte), autograd meets two gradients of one
// weight [V/tp, h]: the fused loss's dense dW (fused_cross_entropy.h) and the lookup's rows.
// libtorch sums them with a whole [V/tp, h] pass either way: a dense lookup gradient is a
// zero-filled [V/tp, h] of its own, and a sparse one is added out of place (libtorch >= 2
// counts a sparse gradient as a tensor subclass and copies dW: 154 MB, about 0.25 s of a
// GPT-2 124M step at seq 256 on 2 cores). Instead the loss's backward offers its dW here, and
// the lookup's backward, which autograd runs after it (the lookup feeds the loss), adds its
// rows into that dW with one index_add and returns no gradient of its own. The sum is the
// same; only where it is formed changes.
//
// A slot lives for one forward and is shared by its copies (the autograd nodes of that forward
// keep it); the lookup's backward empties it. The rows go into dW only while dW is still what
// autograd holds for the weight: when other gradients of it joined in between (several forwards
// through the weight, one backward), the lookup returns its gradient as any lookup does.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace meshtrain {

class TiedGrad {
 public:
  // A slot for the gradients of `weight` (the tied embedding = output weight).
  explicit TiedGrad(const at::Tensor& weight);
  TiedGrad(const TiedGrad& other);
  TiedGrad& operator=(const TiedGrad& other);
  ~TiedGrad();
  // Whether `weight` is the tied one (the same tensor, hence the same autograd leaf).
  bool is_for(const at::Tensor& weight) const;
  // The loss's backward: its dW of the tied weight.
  void offer(const at::Tensor& dw) const;
  // The lookup's backward: the offered dW, or undefined when none; the slot is emptied.
  at::Tensor take() const;
  // How many lookups added their rows into an offered dW (for tests).
  int64_t merged() const;
  void count_merge() const;

  // For an autograd context's saved_data.
  c10::IValue to_ivalue() const;
  static TiedGrad from_ivalue(const c10::IValue& v);

 private:
  struct Slot;
  explicit TiedGrad(c10::intrusive_ptr<Slot> slot);
  c10::intrusive_ptr<Slot> slot_;
};

// weight's rows at `indices` ([...] int64 in [0, V/tp)) -> [..., h], as at::embedding (no
// padding index); the weight's gradient goes into the dW that `tied`'s loss offered, else a
// dense [V/tp, h] of its own.
at::Tensor tied_lookup(const at::Tensor& weight, const at::Tensor& indices, const TiedGrad& tied);

}  // namespace meshtrain
