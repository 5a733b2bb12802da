// LLM Lab 04: column- and row-parallel linears and the Megatron FFN.
//
// With tp ranks and activations of s.b tokens:
//   (a) column parallel Y = X W^T, W split by output rows: each rank computes
//       Y[:, its columns]; gathering Y moves (t-1)/t x s.b.f elements per rank.
//   (b) row parallel Y = X W^T, X split by columns and W by input columns: each
//       rank computes a partial sum; the all-reduce moves 2(t-1)/t x s.b.h.
//   (c) Megatron FFN: column (no gather) -> GeLU -> row: only the row layer's
//       all-reduce in forward, and the column layer's input all-reduce in
//       backward: 2(t-1)/t x s.b.h each way, against (t-1)/t x s.b.f more for
//       gathering in between (f = 4h: 3x the traffic).
// Every result is checked against one process with the full weights; every
// volume derived here is compared with what Comm counted.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "labs/labs.h"
#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/tensor/layers.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {
namespace {

constexpr int64_t kS = 4, kB = 2, kH = 16, kF = 64;

struct Check {
  Comm& comm;
  int bad = 0;
  void value(const char* what, const at::Tensor& got, const at::Tensor& want) {
    const double err = (got - want).abs().max().item<double>();
    if (err > 1e-5) ++bad;
    if (comm.rank() == 0) fmt::print("  {:<44} max |parallel - single| = {:.1e} {}\n", what, err, err <= 1e-5 ? "ok" : "WRONG");
  }
  void bytes(const char* what, const char* op, double derived_elements) {
    auto it = comm.stats().find(op);
    const double measured = it == comm.stats().end() ? 0.0 : static_cast<double>(it->second.wire_bytes) / 4;
    if (std::abs(measured - derived_elements) > 0.5) ++bad;
    if (comm.rank() == 0) {
      fmt::print("  {:<44} derived {:>8.0f} elements, Comm counted {:>8.0f} {}\n", what, derived_elements, measured,
                 std::abs(measured - derived_elements) <= 0.5 ? "ok" : "WRONG");
    }
    comm.reset_stats();
  }
};

}  // namespace

int lab04_column_row(Runtime& rt) {
  Comm& tp = rt.world();
  const int t = tp.size();
  if (kF % t != 0 || kH % t != 0) throw std::invalid_argument("lab 04 needs tp dividing 16: use 1, 2, 4, 8 or 16 ranks");
  Check check{tp};
  ParamStore store(5, tp.rank(), t), full(5, 0, 1);
  TensorParallel par{&tp, false};
  Comm solo("solo", rt.rank());
  TensorParallel one{&solo, false};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  at::Tensor x = at::randn({kS, kB, kH}, gen);
  const double sb = kS * kB, ring = (t - 1.0) / t;
  if (rt.rank() == 0) fmt::print("Lab 04 on tp = {}: s.b = {} tokens, h = {}, f = {}\n", t, sb, kH, kF);

  if (rt.rank() == 0) fmt::print("(a) column parallel, output gathered\n");
  ColumnParallelLinear col(store, "col", kH, kF, false, 0.1, par), col1(full, "col", kH, kF, false, 0.1, one);
  tp.reset_stats();
  at::Tensor y = gather_along(col.forward(x), tp, -1);
  check.bytes("all-gather of Y: (t-1)/t x s.b.f", "all_gather", ring * sb * kF);
  check.value("Y = X W^T", y, col1.forward(x));

  if (rt.rank() == 0) fmt::print("(b) row parallel, input split by columns\n");
  RowParallelLinear row(store, "row", kF, kH, false, 0.1, par), row1(full, "row", kF, kH, false, 0.1, one);
  at::Tensor x2 = at::randn({kS, kB, kF}, gen);
  at::Tensor z = row.forward(x2.chunk(t, -1)[tp.rank()].contiguous());
  check.bytes("all-reduce of partial sums: 2(t-1)/t x s.b.h", "all_reduce", 2 * ring * sb * kH);
  check.value("Y = sum_r X_r W_r^T", z, row1.forward(x2));

  if (rt.rank() == 0) fmt::print("(c) Megatron FFN: column -> GeLU -> row, forward and backward\n");
  RowParallelLinear fc2(store, "fc2", kF, kH, false, 0.1, par), fc2_1(full, "fc2", kF, kH, false, 0.1, one);
  at::Tensor xin = x.clone().set_requires_grad(true), xin1 = x.clone().set_requires_grad(true);
  at::Tensor out = fc2.forward(at::gelu(col.forward(xin), "tanh"));
  check.bytes("forward: one all-reduce, 2(t-1)/t x s.b.h", "all_reduce", 2 * ring * sb * kH);
  out.sum().backward();
  check.bytes("backward: one all-reduce, 2(t-1)/t x s.b.h", "all_reduce", 2 * ring * sb * kH);
  at::Tensor out1 = fc2_1.forward(at::gelu(col1.forward(xin1), "tanh"));
  out1.sum().backward();
  check.value("FFN output", out, out1);
  check.value("dL/dX", xin.grad(), xin1.grad());
  check.value("dL/dW1 (this rank's rows)", col.weight.grad(), col1.weight.grad().chunk(t, 0)[tp.rank()]);
  check.value("dL/dW2 (this rank's columns)", fc2.weight.grad(), fc2_1.weight.grad().chunk(t, 1)[tp.rank()]);
  if (rt.rank() == 0) {
    fmt::print("Gathering between the two layers would add {:.0f} elements per rank per step ({:.1f}x).\n",
               ring * sb * kF, (ring * sb * kF + 2 * ring * sb * kH) / (2 * ring * sb * kH));
  }
  at::Tensor flag = at::tensor({static_cast<int64_t>(check.bad)}, at::kLong);
  tp.all_reduce(flag);
  return flag.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace meshtrain::labs
