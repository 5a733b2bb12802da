// Two models built alike (same spec, group and seed) but for one feature, on
// and off: one training step of each on the same batch (forward, token-mean
// loss, backward, and the tp reduction of finalize_grads when asked). The
// losses must agree to 1e-6 relative; `check(on, off)` is called on each pair
// of parameters (the caller states the gradient tolerance).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "tests/parity.h"

namespace meshtrain::test {

// A parameter's whole gradient: gathered over the tp group where the parameter is split.
inline at::Tensor whole_grad(const Param& p, Comm& tp) {
  return p.tp_dim >= 0 ? gather_along(p.tensor.grad(), tp, p.tp_dim) : p.tensor.grad();
}

template <typename Check>
void expect_same_step(Transformer& on, Transformer& off, const TokenBatch& b, bool finalize, const std::string& what,
                      Check check) {
  double losses[2];
  int i = 0;
  for (Transformer* t : {&on, &off}) {
    at::Tensor loss = t->forward(b.tokens, b.targets).sum() / b.count;
    loss.backward();
    if (finalize) t->finalize_grads();
    losses[i++] = loss.item<double>();
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-6 * losses[1]) << what;
  const auto& a = on.params().params();
  const auto& c = off.params().params();
  ASSERT_EQ(a.size(), c.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) check(a[k], c[k]);
}

}  // namespace meshtrain::test
