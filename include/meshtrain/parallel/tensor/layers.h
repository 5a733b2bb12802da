// Tensor-parallel layers (Megatron-LM, Shoeybi et al., arXiv 1909.08053 sec. 3),
// with optional sequence parallelism (Korthikanti et al., arXiv 2205.05198 sec. 4.2.2).
//
// Activations are [seq, batch, hidden]. With sequence parallelism they arrive
// split along seq (each tp rank holds seq/tp rows) and the column region begins
// with an all-gather, the row region ends with a reduce-scatter; without it
// they arrive whole, the column region begins with copy_to_region (all-reduce
// in backward) and the row region ends with an all-reduce. Same volume either
// way; sequence parallelism also splits the norms' and dropouts' activations.
//
// Weights are [out, in] as in torch.nn.Linear: column-parallel splits `out`
// (dim 0), row-parallel splits `in` (dim 1).
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "meshtrain/nn/fp8.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/parallel/tensor/linear_addons.h"

namespace meshtrain {

class TiedGrad;

class Comm;

struct TensorParallel {
  Comm* comm = nullptr;  // the tp group
  bool sequence_parallel = false;
  int size() const;
  int rank() const;
  // Input of a column-parallel region: all_gather_seq (SP) or copy_to_region.
  at::Tensor enter(const at::Tensor& x) const;
  // Output of a row-parallel region: reduce_scatter_seq (SP) or reduce_from_region.
  at::Tensor leave(const at::Tensor& partial) const;
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  ColumnParallelLinear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias, double std,
                       TensorParallel tp);
  // x already entered the region (whole sequence, this rank's copy): [s, b, in] -> [s, b, out/tp].
  // add_bias false: the caller adds `bias` (fused into the next operation, nn/fused_ops.h).
  at::Tensor forward_entered(const at::Tensor& x, bool add_bias = true) const;
  // Enters the region itself.
  at::Tensor forward(const at::Tensor& x) const { return forward_entered(tp_.enter(x)); }
  at::Tensor weight, bias;
  std::shared_ptr<LinearDelta> delta;    // LoRA: added to the output when set and active
  std::shared_ptr<PackedWeight> packed;  // QLoRA: the weight in NF4 (then `weight` is undefined)
  std::shared_ptr<nn::Fp8Linear> fp8;    // train.precision = fp8: the product in FP8 (nn/fp8.h)

 private:
  TensorParallel tp_;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  RowParallelLinear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias, double std,
                    TensorParallel tp);
  // x: [s, b, in/tp] -> [s(/tp with SP), b, out], summed over tp ranks; bias added once
  // (add_bias false: by the caller, fused into the residual add, nn/fused_ops.h).
  at::Tensor forward(const at::Tensor& x, bool add_bias = true) const;
  at::Tensor weight, bias;
  std::shared_ptr<LinearDelta> delta;    // LoRA: added to the partial product before the reduction
  std::shared_ptr<PackedWeight> packed;  // QLoRA: the weight in NF4 (then `weight` is undefined)
  std::shared_ptr<nn::Fp8Linear> fp8;    // train.precision = fp8: the product in FP8 (nn/fp8.h)

 private:
  TensorParallel tp_;
};

// Embedding whose rows (the vocabulary, padded to a multiple of tp) are split
// across tp ranks; each rank looks up the tokens in its range, zeros the rest,
// and the partial results are summed. Padding rows start at zero and never
// receive a gradient.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  VocabParallelEmbedding(ParamStore& store, const std::string& name, int64_t vocab, int64_t padded_vocab,
                         int64_t hidden, double std, TensorParallel tp);
  // tokens [b, s] -> [s(/tp with SP), b, hidden]. `tied`: the weight is also the
  // output layer's, whose fused loss offers its dW there; the lookup's rows are
  // added into it (tied_grad.h).
  at::Tensor forward(const at::Tensor& tokens, const TiedGrad* tied = nullptr) const;
  int64_t vocab_start() const { return start_; }
  at::Tensor weight;

 private:
  TensorParallel tp_;
  int64_t start_ = 0, rows_ = 0;
};

}  // namespace meshtrain
