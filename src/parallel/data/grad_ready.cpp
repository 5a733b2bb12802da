#include "parallel/data/grad_ready.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include <fmt/ranges.h>

namespace meshtrain {
namespace {

struct ReadyHook : torch::autograd::FunctionPostHook {
  std::function<void()> ready;
  explicit ReadyHook(std::function<void()> f) : ready(std::move(f)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ready();
    return outputs;
  }
};

}  // namespace

std::shared_ptr<torch::autograd::Node> on_grad_ready(const at::Tensor& param, const std::string& name,
                                                     std::function<void()> ready) {
  // The accumulator's pointer type changes across libtorch versions (PLATFORM.md).
  auto acc = torch::autograd::impl::grad_accumulator(param);
  if (!acc) throw std::invalid_argument(fmt::format("{} does not require grad", name));
  acc->add_post_hook(std::make_unique<ReadyHook>(std::move(ready)));
  return std::shared_ptr<torch::autograd::Node>(acc);
}

std::vector<std::string> sweep_unused(const std::vector<Param>& params, std::vector<bool>& ready, bool find_unused,
                                      const std::function<void(size_t)>& count_as_zero) {
  std::vector<std::string> unused;
  for (size_t k = 0; k < params.size(); ++k) {
    if (ready[k]) continue;
    if (!find_unused) {
      unused.push_back(params[k].name);
      continue;
    }
    ready[k] = true;
    count_as_zero(k);
  }
  return unused;
}

void throw_unused(const std::string& who, std::vector<std::string> names) {
  if (names.size() > 3) names.resize(3), names.push_back("...");
  throw std::runtime_error(fmt::format("{}: parameters got no gradient in this backward: {}; if the model really leaves "
                                       "them unused, set ddp.find_unused = true",
                                       who, fmt::join(names, ", ")));
}

}  // namespace meshtrain
