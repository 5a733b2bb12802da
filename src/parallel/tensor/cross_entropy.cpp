#include "meshtrain/parallel/tensor/cross_entropy.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "meshtrain/comm/comm.h"

namespace meshtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCE : torch::autograd::Function<VocabParallelCE> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, Comm* tp,
                            int64_t vocab_start, int64_t vocab) {
    const int64_t local_v = logits.size(-1);
    at::Tensor x = logits.to(at::kFloat);
    // Padded ids never count: their logits are -inf, so their probability is 0.
    const int64_t valid = std::max<int64_t>(0, std::min(local_v, vocab - vocab_start));
    if (valid < local_v) x = x.index_fill(-1, at::arange(valid, local_v, targets.options()), -INFINITY);
    // Stable log-sum-exp across ranks: global max, then the sum of exponentials.
    at::Tensor max = std::get<0>(x.max(-1));
    tp->all_reduce(max, ReduceOp::Max);
    at::Tensor shifted = x - max.unsqueeze(-1);
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(-1);
    tp->all_reduce(sum_exp);
    // The target's shifted logit lives on exactly one rank.
    at::Tensor local_t = targets - vocab_start;
    at::Tensor mine = (local_t >= 0).logical_and(local_t < local_v).logical_and(targets >= 0);
    at::Tensor idx = local_t.masked_fill(mine.logical_not(), 0);
    at::Tensor target_logit = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0.0);
    tp->all_reduce(target_logit);
    at::Tensor ignored = targets < 0;
    at::Tensor loss = (sum_exp.log() - target_logit).masked_fill(ignored, 0.0);
    at::Tensor softmax = exp / sum_exp.unsqueeze(-1);
    ctx->save_for_backward({softmax, idx, mine, ignored});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  // d loss / d logit_j = softmax_j - [j == target]
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    const at::Tensor& idx = saved[1];
    const at::Tensor& mine = saved[2];
    const at::Tensor& ignored = saved[3];
    grad.scatter_add_(-1, idx.unsqueeze(-1), -mine.to(grad.scalar_type()).unsqueeze(-1));
    at::Tensor g = grads[0].masked_fill(ignored, 0.0).unsqueeze(-1);
    grad.mul_(g);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Comm& tp,
                                        int64_t vocab_start, int64_t vocab) {
  return VocabParallelCE::apply(logits, targets, &tp, vocab_start, vocab);
}

}  // namespace meshtrain
