// LLM Lab 03: a collective inside autograd.
//
// Part A. y = AllReduce(x) = sum_r x_r, and rank r's loss L_r = <c_r, y>. The
// job's loss is L = sum_r L_r, so dL/dx_r = sum_s c_s: the gradient of every
// rank depends on every rank's loss, and the backward must all-reduce too. An
// op that all-reduces only in forward gets c_r, which is wrong. We check both
// against central finite differences of L (in double precision).
//
// Part B. The row-parallel linear Y = X W with X split by columns and W by rows:
// Y = sum_r X_r W_r (all-reduce in forward). Here every rank computes the same
// loss from the replicated Y, and that loss is counted once, so
//     dL/dW_r = X_r^T dL/dY   and   dL/dX_r = dL/dY W_r^T
// need no communication at all: the all-reduce's backward is the identity
// (Megatron's g). We check the shards' gradients against one process's full
// X W, and show that an all-reducing backward would be W times too large.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "labs/labs.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Comm* g_comm = nullptr;  // the lab's world group, for the two ops below

// All-reduce forward; all-reduce backward when `sum_backward` is set (Part A's
// correct op), identity otherwise (Megatron's g).
struct AllReduceOp : torch::autograd::Function<AllReduceOp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, bool sum_backward) {
    ctx->saved_data["sum_backward"] = sum_backward;
    at::Tensor y = x.clone();
    g_comm->all_reduce(y);
    fmt::print("rank {}:   forward all_reduce (sequence {})\n", g_comm->ranks()[g_comm->rank()], g_comm->seq());
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor grad = g[0].contiguous().clone();
    if (ctx->saved_data["sum_backward"].toBool()) {
      g_comm->all_reduce(grad);
      fmt::print("rank {}:   backward all_reduce (sequence {})\n", g_comm->ranks()[g_comm->rank()], g_comm->seq());
    }
    return {grad, at::Tensor()};
  }
};

double total_loss(const at::Tensor& x, const at::Tensor& c) {
  at::Tensor y = x.clone();
  g_comm->all_reduce(y);
  at::Tensor l = (c * y).sum().reshape({1});
  g_comm->all_reduce(l);
  return l.item<double>();
}

}  // namespace

int lab03_autograd_allreduce(Runtime& rt) {
  Comm& world = rt.world();
  g_comm = &world;
  const int rank = rt.rank(), n = rt.world_size();
  int bad = 0;
  auto opts = at::TensorOptions().dtype(at::kDouble);

  // ---- Part A
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + rank);
  at::Tensor x0 = at::randn({3}, gen, opts), c = at::randn({3}, gen, opts);
  at::Tensor fd = at::zeros({3}, opts);
  const double eps = 1e-6;
  // Finite differences of the job's loss: every rank perturbs in turn (collectively).
  for (int owner = 0; owner < n; ++owner) {
    for (int64_t i = 0; i < 3; ++i) {
      at::Tensor xp = x0.clone(), xm = x0.clone();
      if (rank == owner) {
        xp[i] += eps;
        xm[i] -= eps;
      }
      const double d = (total_loss(xp, c) - total_loss(xm, c)) / (2 * eps);
      if (rank == owner) fd[i] = d;
    }
  }
  for (bool sum_backward : {true, false}) {
    if (rank == 0) fmt::print("Part A: AllReduce with {} backward\n", sum_backward ? "all-reduce" : "identity");
    at::Tensor x = x0.clone().set_requires_grad(true);
    at::Tensor y = AllReduceOp::apply(x, sum_backward);
    (c * y).sum().backward();
    const double err = (x.grad() - fd).abs().max().item<double>();
    const bool ok = err < 1e-6;
    fmt::print("rank {}: autograd dL/dx {} vs finite differences: max error {:.2e} -> {}\n", rank,
               sum_backward ? "(all-reduce backward)" : "(identity backward)  ", err,
               ok ? "matches" : "does NOT match");
    if (sum_backward != ok) ++bad;  // all-reduce backward must match; identity must not (n > 1)
    world.barrier();
  }

  // ---- Part B
  if (rank == 0) fmt::print("Part B: row-parallel linear Y = sum_r X_r W_r, loss replicated\n");
  const int64_t rows = 4, k = 2 * n, cols = 6, kr = k / n;
  auto shared = at::make_generator<at::CPUGeneratorImpl>(123);
  at::Tensor X = at::randn({rows, k}, shared, opts), W = at::randn({k, cols}, shared, opts);
  at::Tensor C = at::randn({rows, cols}, shared, opts);
  // One process: the full product.
  at::Tensor Xf = X.clone().set_requires_grad(true), Wf = W.clone().set_requires_grad(true);
  (at::matmul(Xf, Wf) * C).sum().backward();
  for (bool sum_backward : {false, true}) {
    at::Tensor Xr = X.narrow(1, rank * kr, kr).clone().set_requires_grad(true);
    at::Tensor Wr = W.narrow(0, rank * kr, kr).clone().set_requires_grad(true);
    at::Tensor Y = AllReduceOp::apply(at::matmul(Xr, Wr), sum_backward);
    (Y * C).sum().backward();
    const double ew = (Wr.grad() - Wf.grad().narrow(0, rank * kr, kr)).abs().max().item<double>();
    const double ex = (Xr.grad() - Xf.grad().narrow(1, rank * kr, kr)).abs().max().item<double>();
    const double ratio = Wr.grad().norm().item<double>() / Wf.grad().narrow(0, rank * kr, kr).norm().item<double>();
    const bool ok = ew < 1e-9 && ex < 1e-9;
    fmt::print("rank {}: {} backward: |dW_r - dW[r]| {:.1e}, |dX_r - dX[:, r]| {:.1e}, grad ratio {:.2f} -> {}\n",
               rank, sum_backward ? "all-reduce" : "identity  ", ew, ex, ratio, ok ? "matches" : "does NOT match");
    if (sum_backward == ok && n > 1) ++bad;  // identity must match; all-reduce gives n x
    if (n == 1 && !ok) ++bad;
  }
  if (rank == 0) {
    fmt::print(
        "Rule: a collective's backward is its adjoint under the loss the job optimises. Summed per-rank\n"
        "losses need the all-reduce back (Part A); one replicated loss needs none (Part B: row parallel).\n");
  }
  at::Tensor flag = at::tensor({static_cast<int64_t>(bad)}, at::kLong);
  world.all_reduce(flag);
  return flag.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace meshtrain::labs
