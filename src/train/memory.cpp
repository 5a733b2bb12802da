#include "meshtrain/train/memory.h"

#include <fmt/format.h>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/plan/memory.h"

namespace meshtrain {
namespace {

int64_t bytes(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

MemoryUse measure_memory(const std::vector<Param>& params, AdamW& opt, const DataParallel* ddp) {
  MemoryUse m;
  for (const auto& p : params) {
    m.params += bytes(p.tensor);
    m.grads += bytes(p.tensor.grad());
  }
  for (const auto& t : opt.exp_avg()) m.optimizer += bytes(t);
  for (const auto& t : opt.exp_avg_sq()) m.optimizer += bytes(t);
  if (ddp) m.buffers = ddp->buffer_bytes();
  return m;
}

std::string memory_table(int64_t psi, int n, const MemoryUse& measured, const std::string& mode) {
  const double P = static_cast<double>(psi), N = n;
  auto h = [](double b) { return plan::human_bytes(b); };
  std::string out = fmt::format("training state per rank, P = {} parameters, N = {} data-parallel ranks (ZeRO paper, K = 12):\n",
                                psi, n);
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "", "mixed precision", "fp32");
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "DDP: 16P | 16P", h(16 * P), h(16 * P));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-1: 4P+12P/N | 8P+8P/N", h(4 * P + 12 * P / N), h(8 * P + 8 * P / N));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-2: 2P+14P/N | 4P+12P/N", h(2 * P + 14 * P / N), h(4 * P + 12 * P / N));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-3: 16P/N | 16P/N", h(16 * P / N), h(16 * P / N));
  out += fmt::format("  measured ({}): parameters {} + gradients {} + optimizer {} = {}; communication buffers {}\n",
                     mode, h(static_cast<double>(measured.params)), h(static_cast<double>(measured.grads)),
                     h(static_cast<double>(measured.optimizer)), h(static_cast<double>(measured.state())),
                     h(static_cast<double>(measured.buffers)));
  return out;
}

}  // namespace meshtrain
