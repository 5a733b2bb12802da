// LLM Lab 06: a Megatron-style transformer trained a few steps, with a
// per-segment profile.
//
// The model is meshtrain's Transformer (norm -> attention split by heads ->
// residual -> norm -> column/row FFN -> residual, the autograd all-reduces of
// tensor parallelism), tp = all ranks, a fixed batch, plain SGD. Every step's
// loss is checked against the same model in one process (fp32, relative 1e-5),
// and the forward (attention / FFN / rest) and backward (per block) times are
// printed at the end.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <cmath>

#include "labs/labs.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {

int lab06_megatron_block(Runtime& rt) {
  Comm& tp = rt.world();
  plan::ModelSpec spec = plan::preset("gpt-tiny");
  spec.layers = 2;
  spec.seq = 64;
  spec.dropout = 0;
  if (spec.heads % tp.size() != 0) throw std::invalid_argument("lab 06's model has 4 heads: use 1, 2 or 4 ranks");
  Comm solo("solo", rt.rank());
  Transformer model(spec, tp, tp.size() > 1, 42), single(spec, solo, false, 42);
  SegmentProfiler prof;
  model.set_profiler(&prof);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor data = at::randint(spec.vocab, {4, spec.seq + 1}, gen, at::kLong);
  at::Tensor tokens = data.narrow(1, 0, spec.seq).contiguous(), targets = data.narrow(1, 1, spec.seq).contiguous();
  const double count = static_cast<double>(targets.numel()), lr = 0.1;
  if (rt.rank() == 0) {
    fmt::print("Lab 06: {} layers, h={}, {} heads, tp={} with sequence parallelism {}; {} parameters per rank\n",
               spec.layers, spec.hidden, spec.heads, tp.size(), tp.size() > 1 ? "on" : "off",
               model.params().local_numel());
  }
  int bad = 0;
  auto sgd = [&](ParamStore& ps) {
    for (auto& p : ps.params()) {
      p.tensor.detach().sub_(p.tensor.grad() * lr);
      p.tensor.mutable_grad() = at::Tensor();
    }
  };
  const int steps = 6;
  for (int step = 1; step <= steps; ++step) {
    at::Tensor loss = model.forward(tokens, targets).sum() / count;
    loss.backward();
    prof.collect_backward();
    model.finalize_grads();
    sgd(model.params());
    at::Tensor ref = single.forward(tokens, targets).sum() / count;
    ref.backward();
    sgd(single.params());
    const double rel = std::abs(loss.item<double>() - ref.item<double>()) / ref.item<double>();
    if (rel > 1e-5) ++bad;
    if (rt.rank() == 0) {
      fmt::print("step {}: loss {:.5f} (one process {:.5f}, relative difference {:.1e})\n", step, loss.item<double>(),
                 ref.item<double>(), rel);
    }
  }
  if (rt.rank() == 0) fmt::print("Segment profile, rank 0, mean of {} steps:\n{}", steps, prof.table(steps));
  at::Tensor flag = at::tensor({static_cast<int64_t>(bad)}, at::kLong);
  tp.all_reduce(flag);
  return flag.item<int64_t>() == 0 ? 0 : 1;
}

}  // namespace meshtrain::labs
