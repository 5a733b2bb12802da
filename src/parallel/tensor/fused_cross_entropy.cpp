#include "meshtrain/parallel/tensor/fused_cross_entropy.h"

#include "meshtrain/compat.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "meshtrain/comm/comm.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/parallel/tensor/tied_grad.h"

namespace meshtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rows [begin, begin + r) of one chunk, and what the chunk's targets mean on this rank.
struct Chunk {
  int64_t begin = 0, rows = 0;
  at::Tensor idx;      // [r] the target's column in this rank's slice (0 where not mine)
  at::Tensor mine;     // [r] the target's column is on this rank
  at::Tensor ignored;  // [k] indices (within the chunk) of rows whose target is < 0

  Chunk(const at::Tensor& targets, int64_t begin_, int64_t rows_, int64_t vocab_start, int64_t local_v)
      : begin(begin_), rows(rows_) {
    const at::Tensor t = targets.narrow(0, begin, rows);
    const at::Tensor local = t - vocab_start;
    mine = (local >= 0).logical_and(local < local_v);
    idx = local.masked_fill(mine.logical_not(), 0);
    ignored = (t < 0).nonzero().squeeze(1);
  }

  // Logits of the chunk in fp32 [r, V/tp]; padded columns at -inf (probability 0).
  at::Tensor logits(const at::Tensor& x, const at::Tensor& w, int64_t valid) const {
    at::Tensor l = at::mm(x.narrow(0, begin, rows), w.t());
    if (l.scalar_type() != at::kFloat) l = l.to(at::kFloat);
    if (valid < l.size(1)) l.narrow(1, valid, l.size(1) - valid).fill_(-INFINITY);
    return l;
  }

  // In place: probabilities p -> p - onehot(target); ignored rows -> 0.
  void subtract_targets(at::Tensor& p) const {
    p.scatter_add_(1, idx.unsqueeze(1), mine.to(at::kFloat).neg().unsqueeze(1));
    if (ignored.numel() > 0) p.index_fill_(0, ignored, 0.0);
  }

  // dX rows of the chunk and dW += Gᵀ X for the chunk's gradient g (fp32 [r, V/tp]),
  // each where defined; the first chunk writes dW (allocated uninitialised: no zero-fill pass).
  void backprop(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w, at::Tensor& dx, at::Tensor& dw) const {
    const bool first = begin == 0;
    const at::Tensor gc = g.to(w.scalar_type());
    if (dx.defined()) {
      at::Tensor dx_rows = dx.narrow(0, begin, rows);
      if (dx.scalar_type() == gc.scalar_type()) {
        at::mm_out(dx_rows, gc, w);
      } else {
        dx_rows.copy_(at::mm(gc, w));
      }
    }
    if (!dw.defined()) return;
    const at::Tensor xc = x.narrow(0, begin, rows);
    if (dw.scalar_type() != gc.scalar_type()) {
      const at::Tensor part = at::mm(gc.t(), xc);
      first ? dw.copy_(part) : dw.add_(part);
    } else if (first) {
      at::mm_out(dw, gc.t(), xc);
    } else {
      dw.addmm_(gc.t(), xc);
    }
  }
};

// The compute dtype: autocast's on x's device when it is on (matmuls are in its lower-precision
// list), else x's.
at::ScalarType compute_dtype(const at::Tensor& x) {
  const AutocastSwitch a = autocast_switch(x.device().type());
  return a.enabled ? a.dtype : x.scalar_type();
}

struct FusedLinearCE : torch::autograd::Function<FusedLinearCE> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, Comm* tp, int64_t vocab_start, int64_t vocab, int64_t chunk,
                            bool need_dx, bool need_dw, const TiedGrad* tied) {
    const int64_t n = x.size(0), local_v = weight.size(0);
    const int64_t valid = std::clamp<int64_t>(vocab - vocab_start, 0, local_v);
    const at::ScalarType dtype = compute_dtype(x);
    const at::Tensor xc = x.to(dtype), wc = weight.to(dtype);
    const auto f32 = x.options().dtype(at::kFloat);
    at::Tensor loss = at::empty({n}, f32), lse = at::empty({n}, f32);
    at::Tensor dx = need_dx ? at::empty(x.sizes(), x.options()) : at::Tensor();
    at::Tensor dw = !need_dw ? at::Tensor() : n > 0 ? at::empty(weight.sizes(), weight.options())
                                                    : at::zeros(weight.sizes(), weight.options());
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const Chunk c(targets, begin, std::min(chunk, n - begin), vocab_start, local_v);
      at::Tensor l = c.logits(xc, wc, valid);
      // Stable log-sum-exp across ranks: the global max, then the sum of exponentials
      // and the target's shifted logit (on exactly one rank) in one all-reduce.
      at::Tensor max = std::get<0>(l.max(1));
      tp->all_reduce(max, ReduceOp::Max);
      l.sub_(max.unsqueeze(1));
      at::Tensor sums = at::empty({2, c.rows}, f32);
      sums[1].copy_(l.gather(1, c.idx.unsqueeze(1)).squeeze(1).masked_fill(c.mine.logical_not(), 0.0));
      l.exp_();
      at::Tensor sum_exp = sums[0];
      at::sum_out(sum_exp, l, 1);
      tp->all_reduce(sums);
      const at::Tensor log_sum = sums[0].log();
      at::Tensor loss_rows = loss.narrow(0, begin, c.rows);
      at::sub_out(loss_rows, log_sum, sums[1]);
      if (c.ignored.numel() > 0) loss_rows.index_fill_(0, c.ignored, 0.0);
      at::Tensor lse_rows = lse.narrow(0, begin, c.rows);
      at::add_out(lse_rows, log_sum, max);
      if (need_dx || need_dw) {
        l.div_(sums[0].unsqueeze(1));
        c.subtract_targets(l);
        c.backprop(l, xc, wc, dx, dw);
      }
    }
    ctx->save_for_backward({x, weight, targets, lse});
    ctx->saved_data["dx"] = dx;
    ctx->saved_data["dw"] = dw;
    ctx->saved_data["vocab_start"] = vocab_start;
    ctx->saved_data["valid"] = valid;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["deferrable"] = nn::weight_grads_deferrable();
    ctx->saved_data["consumed"] = false;
    if (tied && tied->is_for(weight)) ctx->saved_data["tied"] = tied->to_ivalue();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const at::Tensor g = grads[0].to(at::kFloat);
    at::Tensor dx, dw;
    double scale = 1.0;  // what dW still has to be multiplied by
    const at::Tensor counted = g.masked_select(targets >= 0);
    const bool uniform = counted.numel() > 0 && counted.eq(counted[0]).all().item<bool>();
    if (uniform && !ctx->saved_data["consumed"].toBool()) {
      // The forward's gradients, scaled; dW in place (consumed: a second backward recomputes).
      scale = counted[0].item<double>();
      dx = ctx->saved_data["dx"].toTensor();
      dw = ctx->saved_data["dw"].toTensor();
      ctx->saved_data["dx"] = ctx->saved_data["dw"] = at::Tensor();
      ctx->saved_data["consumed"] = true;
      if (dx.defined() && scale != 1.0) dx.mul_(scale);
    } else {
      std::tie(dx, dw) = recompute(ctx, x, weight, targets, lse, g);
    }
    if (!dw.defined()) return pad(dx, dw);
    nn::WeightGradStash* stash = nn::weight_grad_target();
    const bool tied = ctx->saved_data.count("tied") > 0;
    if (!stash && !tied && nn::grad_accumulates_in_place(weight, dw.scalar_type())) {
      weight.grad().add_(dw, scale);  // the scaling and AccumulateGrad's addition in one pass (nn/linear.h)
      return pad(dx, at::Tensor());
    }
    if (scale != 1.0) dw.mul_(scale);
    if (stash && ctx->saved_data["deferrable"].toBool()) {
      stash->add_ready(weight, dw);  // zero-bubble schedules: W's gradient waits for the W pass
      return pad(dx, at::Tensor());
    }
    if (tied) TiedGrad::from_ivalue(ctx->saved_data["tied"]).offer(dw);
    return pad(dx, dw);
  }

  // The gradients of (x, weight) and none for the other inputs.
  static variable_list pad(const at::Tensor& dx, const at::Tensor& dw) {
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // Per-token upstream gradients g: each chunk's probabilities again from its logits and lse, rows weighted by g.
  static std::pair<at::Tensor, at::Tensor> recompute(AutogradContext* ctx, const at::Tensor& x,
                                                     const at::Tensor& weight, const at::Tensor& targets,
                                                     const at::Tensor& lse, const at::Tensor& g) {
    const int64_t n = x.size(0), chunk = ctx->saved_data["chunk"].toInt();
    const int64_t vocab_start = ctx->saved_data["vocab_start"].toInt(), valid = ctx->saved_data["valid"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor xc = x.to(dtype), wc = weight.to(dtype);
    at::Tensor dx = ctx->needs_input_grad(0) ? at::empty(x.sizes(), x.options()) : at::Tensor();
    at::Tensor dw = !ctx->needs_input_grad(1) ? at::Tensor()
                    : n > 0 ? at::empty(weight.sizes(), weight.options()) : at::zeros(weight.sizes(), weight.options());
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const Chunk c(targets, begin, std::min(chunk, n - begin), vocab_start, weight.size(0));
      at::Tensor p = c.logits(xc, wc, valid);
      p.sub_(lse.narrow(0, begin, c.rows).unsqueeze(1)).exp_();
      c.subtract_targets(p);
      p.mul_(g.narrow(0, begin, c.rows).unsqueeze(1));
      c.backprop(p, xc, wc, dx, dw);
    }
    return {dx, dw};
  }
};

}  // namespace

int64_t default_chunk_rows(int64_t n, int64_t local_vocab, int64_t hidden) {
  return plan::fused_loss_chunk_rows(n, local_vocab, hidden);
}

at::Tensor fused_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                      Comm& tp, int64_t vocab_start, int64_t vocab, int64_t chunk_rows,
                                      const TiedGrad* tied) {
  if (x.dim() != 2 || weight.dim() != 2 || x.size(1) != weight.size(1) || targets.dim() != 1 ||
      targets.size(0) != x.size(0)) {
    throw std::invalid_argument("fused_linear_cross_entropy: x [N, h], weight [V, h] and targets [N] expected");
  }
  if (chunk_rows < 0) throw std::invalid_argument("fused_linear_cross_entropy: chunk_rows must be >= 0");
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : default_chunk_rows(x.size(0), weight.size(0), x.size(1));
  const bool grad_mode = at::GradMode::is_enabled();
  return FusedLinearCE::apply(x, weight, targets, &tp, vocab_start, vocab, chunk, grad_mode && x.requires_grad(),
                              grad_mode && weight.requires_grad(), tied);
}

}  // namespace meshtrain
