// Autograd collectives: the gradient autograd computes equals central finite
// differences of the job's loss, evaluated collectively across real ranks in
// double precision (tolerance 1e-6: the loss is bilinear, so the only error is
// rounding, about 1e-10 here).
//
// Conventions (what the loss of the job is):
//   an input is "replicated" when all ranks hold the same variable (perturbed on
//   every rank at once) and "sharded" when each rank holds its own (perturbed on
//   its owner only); an output is "replicated" when the loss uses it once
//   (L = <c, y>, c the same everywhere) and "sharded" when every rank's use
//   counts (L = sum_r <c_r, y_r>).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <functional>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {

using Fn = std::function<at::Tensor(const at::Tensor&)>;
const auto kOpts = at::TensorOptions().dtype(at::kDouble);

double job_loss(const at::Tensor& y, const at::Tensor& c, bool sharded_out, Comm& comm) {
  at::Tensor l = (y * c).sum().reshape({1});
  if (sharded_out) comm.all_reduce(l);
  return l.item<double>();
}

void check_gradient(const char* what, const Fn& f, at::IntArrayRef in_shape, bool sharded_in, bool sharded_out) {
  Comm& comm = runtime().world();
  const int me = comm.rank(), n = comm.size();
  auto shared = at::make_generator<at::CPUGeneratorImpl>(11);
  auto own = at::make_generator<at::CPUGeneratorImpl>(100 + me);
  at::Tensor x0 = at::randn(in_shape, sharded_in ? own : shared, kOpts);
  at::Tensor y0 = f(x0);
  at::Tensor c = at::randn(y0.sizes(), sharded_out ? own : shared, kOpts);

  at::Tensor x = x0.clone().set_requires_grad(true);
  (f(x) * c).sum().backward();
  at::Tensor grad = x.grad();

  const double eps = 1e-6;
  at::Tensor fd = at::zeros_like(x0);
  const int owners = sharded_in ? n : 1;
  for (int owner = 0; owner < owners; ++owner) {
    for (int64_t i = 0; i < x0.numel(); ++i) {
      at::Tensor xp = x0.clone(), xm = x0.clone();
      if (!sharded_in || me == owner) {
        xp.view(-1)[i] += eps;
        xm.view(-1)[i] -= eps;
      }
      const double d = (job_loss(f(xp), c, sharded_out, comm) - job_loss(f(xm), c, sharded_out, comm)) / (2 * eps);
      if (!sharded_in || me == owner) fd.view(-1)[i] = d;
    }
  }
  const double err = (grad - fd).abs().max().item<double>();
  EXPECT_LT(err, 1e-6) << what << ": autograd vs finite differences, max error " << err;
}

TEST(Autograd, CopyToRegion) {
  Comm& c = runtime().world();
  check_gradient("copy_to_region", [&](const at::Tensor& x) { return copy_to_region(x, c); }, {3, 2}, false, true);
}

TEST(Autograd, ReduceFromRegion) {
  Comm& c = runtime().world();
  check_gradient("reduce_from_region", [&](const at::Tensor& x) { return reduce_from_region(x, c); }, {3, 2}, true,
                 false);
}

TEST(Autograd, ScatterToRegion) {
  Comm& c = runtime().world();
  const int n = c.size();
  check_gradient("scatter_to_region dim 1", [&](const at::Tensor& x) { return scatter_to_region(x, c, 1); },
                 {2, 2 * n}, false, true);
  check_gradient("scatter_to_region dim 0", [&](const at::Tensor& x) { return scatter_to_region(x, c, 0); }, {n, 2},
                 false, true);
}

TEST(Autograd, GatherFromRegion) {
  Comm& c = runtime().world();
  check_gradient("gather_from_region dim -1", [&](const at::Tensor& x) { return gather_from_region(x, c, -1); },
                 {2, 3}, true, false);
}

TEST(Autograd, AllGatherSeq) {
  Comm& c = runtime().world();
  check_gradient("all_gather_seq dim 0", [&](const at::Tensor& x) { return all_gather_seq(x, c, 0); }, {2, 1, 3},
                 true, true);
  check_gradient("all_gather_seq dim 1", [&](const at::Tensor& x) { return all_gather_seq(x, c, 1); }, {2, 2, 1},
                 true, true);
}

TEST(Autograd, ReduceScatterSeq) {
  Comm& c = runtime().world();
  const int n = c.size();
  check_gradient("reduce_scatter_seq dim 0", [&](const at::Tensor& x) { return reduce_scatter_seq(x, c, 0); },
                 {2 * n, 1, 2}, true, true);
  check_gradient("reduce_scatter_seq dim 1", [&](const at::Tensor& x) { return reduce_scatter_seq(x, c, 1); },
                 {2, n, 2}, true, true);
}

TEST(Autograd, AllToAll) {
  Comm& c = runtime().world();
  const int n = c.size();
  // Ulysses-style: split heads (dim 2), gather sequence (dim 0).
  check_gradient("all_to_all_dims", [&](const at::Tensor& x) { return all_to_all_dims(x, c, 2, 0); }, {2, 1, n, 2},
                 true, true);
}

TEST(Autograd, ForwardValuesMatchDefinitions) {
  Comm& c = runtime().world();
  const int n = c.size(), me = c.rank();
  at::Tensor x = at::full({2, 3}, static_cast<double>(me), kOpts);
  at::Tensor g = gather_from_region(x, c, 1);
  ASSERT_EQ(g.size(1), 3 * n);
  for (int r = 0; r < n; ++r) EXPECT_EQ(g[0][3 * r].item<double>(), r);
  at::Tensor full = at::arange(2 * n, kOpts).reshape({2 * n, 1});
  at::Tensor rs = reduce_scatter_seq(full, c, 0);
  EXPECT_EQ(rs[0][0].item<double>(), 2.0 * me * n);
  at::Tensor a2a = all_to_all_dims(at::full({1, n}, static_cast<double>(me), kOpts), c, 1, 0);
  ASSERT_EQ(a2a.size(0), n);
  for (int r = 0; r < n; ++r) EXPECT_EQ(a2a[r][0].item<double>(), r);
}

TEST(Autograd, IndivisibleDimIsAClearError) {
  Comm& c = runtime().world();
  if (c.size() == 1) GTEST_SKIP() << "needs more than one rank";
  at::Tensor x = at::zeros({c.size() + 1, 2}, kOpts);
  try {
    scatter_to_region(x, c, 0);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::test
