#include "meshtrain/peft/adapter.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <memory>
#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/linear.h"

namespace meshtrain {

at::Tensor BottleneckAdapter::forward(const at::Tensor& a) const {
  return a + nn::linear(at::gelu(nn::linear(a, down_w, down_b)), up_w, up_b);
}

int64_t apply_adapters(Transformer& m, const AdapterOptions& o) {
  if (o.bottleneck < 1) throw std::invalid_argument(fmt::format("adapter bottleneck {} must be >= 1", o.bottleneck));
  ParamStore& store = m.params();
  const size_t base_params = store.params().size();
  const int64_t h = m.spec().hidden, r = o.bottleneck;
  const bool partial = m.sequence_parallel();
  auto make = [&](const std::string& name) {
    auto ad = std::make_shared<BottleneckAdapter>();
    ad->down_w = store.create(name + ".down.weight", {r, h}, Init::Normal, o.init_std, -1, partial);
    ad->down_b = store.create(name + ".down.bias", {r}, Init::Zeros, 0, -1, partial);
    ad->up_w = store.create(name + ".up.weight", {h, r}, Init::Zeros, 0, -1, partial);
    ad->up_b = store.create(name + ".up.bias", {h}, Init::Zeros, 0, -1, partial);
    return ad;
  };
  int64_t added = 0;
  for (int64_t i = 0; i < m.num_blocks(); ++i) {
    Block& b = m.block_mut(i);
    const std::string p = fmt::format("layers.{}.", m.part().first + i);
    b.adapter_attn = make(p + "adapter_attn");
    b.adapter_mlp = make(p + "adapter_mlp");
    added += 2;
  }
  store.freeze_first(base_params);
  return added;
}

}  // namespace meshtrain
