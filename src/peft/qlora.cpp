#include "meshtrain/peft/qlora.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/lora.h"

namespace meshtrain {
namespace {

// Saves the NF4 weight (owned by its linear, which outlives the graph), not a
// dequantised copy: backward dequantises again.
struct Nf4LinearFn : torch::autograd::Function<Nf4LinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const Nf4Tensor* w) {
    ctx->saved_data["w"] = reinterpret_cast<int64_t>(w);
    return at::matmul(x, nf4_dequantize(*w, x.scalar_type()).t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto* w = reinterpret_cast<const Nf4Tensor*>(ctx->saved_data["w"].toInt());
    return {at::matmul(grad[0], nf4_dequantize(*w, grad[0].scalar_type())), at::Tensor()};
  }
};

// Calls f(name, weight, nf4 slot) for every block linear.
template <typename F>
void for_each_linear(Transformer& m, F f) {
  auto l = m.linears();
  for (auto& [name, lin] : l.column) f(name, lin->weight, lin->packed);
  for (auto& [name, lin] : l.row) f(name, lin->weight, lin->packed);
}

}  // namespace

at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& w) {
  // Under autocast the matmul runs in the autocast dtype: dequantise into it.
  return Nf4LinearFn::apply(x, &w);
}

int64_t quantize_base(Transformer& m, const QloraOptions& o) {
  auto& params = m.params().params();
  const bool has_lora = std::any_of(params.begin(), params.end(),
                                    [](const Param& p) { return p.name.find(".lora_") != std::string::npos; });
  if (!has_lora) throw std::invalid_argument("QLoRA quantises the base under LoRA adapters: apply LoRA first");
  std::vector<std::string> names;
  int64_t bytes = 0;
  for_each_linear(m, [&](const std::string& name, at::Tensor& weight, std::shared_ptr<PackedWeight>& packed) {
    if (packed) throw std::invalid_argument(fmt::format("{} is already quantised", name));
    auto nf4 = std::make_shared<Nf4Weight>(nf4_quantize(weight, o.block, o.double_quant));
    bytes += nf4->tensor.bytes();
    packed = nf4;
    weight = at::Tensor();  // the fp32 copy goes with the store's entry below
    names.push_back(name + ".weight");
  });
  params.erase(std::remove_if(params.begin(), params.end(),
                              [&](const Param& p) {
                                return std::find(names.begin(), names.end(), p.name) != names.end();
                              }),
               params.end());
  return bytes;
}

int64_t quantized_bytes(Transformer& m) {
  int64_t bytes = 0;
  for_each_linear(m, [&](const std::string&, at::Tensor&, std::shared_ptr<PackedWeight>& packed) {
    if (const auto* nf4 = dynamic_cast<const Nf4Weight*>(packed.get())) bytes += nf4->tensor.bytes();
  });
  return bytes;
}

}  // namespace meshtrain
