// LLM Lab 02: minimal data-parallel training of a linear model, 5 steps.
//
// What DDP's one-line wrapper does, spelled out:
//   1. broadcast rank 0's initial weights (ranks start from different seeds here
//      to make the broadcast visible);
//   2. each rank takes its own slice of the global batch;
//   3. after backward, average the gradients across ranks (all_reduce sum / W):
//      with equal slices, the mean of the local mean-losses' gradients is the
//      gradient of the global mean loss;
//   4. every rank applies the same update, so the replicas stay identical.
// Rank 0 also trains the same model on the whole batch in one process and checks
// that losses and weights agree (fp32 tolerance 1e-5 relative: only the
// summation order differs).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "labs/labs.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {
namespace {

constexpr int64_t kIn = 4, kOut = 2, kGlobalBatch = 8;
constexpr int kSteps = 5;
constexpr double kLr = 0.1;

struct Linear {
  at::Tensor w, b;
  at::Tensor forward(const at::Tensor& x) const { return at::matmul(x, w.t()) + b; }
  void sgd_step() {
    w.detach().sub_(w.grad() * kLr);
    b.detach().sub_(b.grad() * kLr);
    w.mutable_grad() = at::Tensor();
    b.mutable_grad() = at::Tensor();
  }
};

double checksum(const Linear& m) { return m.w.sum().item<double>() + m.b.sum().item<double>(); }

}  // namespace

int lab02_data_parallel(Runtime& rt) {
  Comm& world = rt.world();
  const int rank = rt.rank(), n = rt.world_size();
  if (kGlobalBatch % n != 0) {
    throw std::invalid_argument(fmt::format("lab 02 splits a batch of {} samples: use 1, 2, 4 or 8 ranks", kGlobalBatch));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + rank);
  Linear model{at::randn({kOut, kIn}, gen), at::zeros({kOut})};
  fmt::print("rank {}: initial weights checksum {:+.6f} (own seed)\n", rank, checksum(model));
  world.broadcast(model.w, 0);
  world.broadcast(model.b, 0);
  fmt::print("rank {}: after broadcast from rank 0 {:+.6f}\n", rank, checksum(model));
  Linear single{model.w.clone(), model.b.clone()};  // rank 0's single-process reference
  model.w.set_requires_grad(true);
  model.b.set_requires_grad(true);
  single.w.set_requires_grad(true);
  single.b.set_requires_grad(true);

  // The same global batch on every rank (shared seed); rank r uses rows [r*B/n, (r+1)*B/n).
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(42);
  at::Tensor x = at::randn({kGlobalBatch, kIn}, data_gen);
  at::Tensor y = at::matmul(x, at::randn({kOut, kIn}, data_gen).t()) + 0.5;
  const int64_t per = kGlobalBatch / n;
  at::Tensor xl = x.narrow(0, rank * per, per), yl = y.narrow(0, rank * per, per);

  int bad = 0;
  for (int step = 1; step <= kSteps; ++step) {
    at::Tensor loss = (model.forward(xl) - yl).pow(2).mean();
    loss.backward();
    const double local_g = model.w.grad().norm().item<double>();
    world.all_reduce(model.w.grad(), ReduceOp::Avg);
    world.all_reduce(model.b.grad(), ReduceOp::Avg);
    at::Tensor global_loss = loss.detach().clone();
    world.all_reduce(global_loss, ReduceOp::Avg);
    fmt::print("rank {} step {}: local loss {:.6f} | global loss {:.6f} | local |grad W| {:.5f} -> averaged {:.5f}\n",
               rank, step, loss.item<double>(), global_loss.item<double>(), local_g,
               model.w.grad().norm().item<double>());
    model.sgd_step();
    if (rank == 0) {
      at::Tensor ref_loss = (single.forward(x) - y).pow(2).mean();
      ref_loss.backward();
      single.sgd_step();
      const double rel = std::abs(ref_loss.item<double>() - global_loss.item<double>()) /
                         std::max(1e-12, std::abs(ref_loss.item<double>()));
      if (rel > 1e-5) ++bad;
      fmt::print("rank 0 step {}: single-process loss {:.6f} (relative difference {:.1e})\n", step,
                 ref_loss.item<double>(), rel);
    }
  }
  // Replicas must be identical: compare every rank's weights with rank 0's.
  at::Tensor w0 = model.w.detach().clone();
  world.broadcast(w0, 0);
  const double spread = (model.w.detach() - w0).abs().max().item<double>();
  fmt::print("rank {}: final checksum {:+.6f}, max difference to rank 0 {:.1e}\n", rank, checksum(model), spread);
  if (spread != 0.0) ++bad;
  if (rank == 0) {
    const double diff = (model.w.detach() - single.w.detach()).abs().max().item<double>();
    fmt::print("rank 0: data-parallel vs single-process weights: max difference {:.1e} {}\n", diff,
               diff <= 1e-5 ? "ok" : "WRONG");
    if (diff > 1e-5) ++bad;
  }
  at::Tensor flag = at::tensor({static_cast<int64_t>(bad)}, at::kLong);
  world.all_reduce(flag);
  return flag.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace meshtrain::labs
