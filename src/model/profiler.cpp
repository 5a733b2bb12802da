#include "meshtrain/model/profiler.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sstream>

namespace meshtrain {

struct ProfileMark : torch::autograd::Function<ProfileMark> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, SegmentProfiler* p,
                            int64_t block, bool output) {
    ctx->saved_data["p"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(p));
    ctx->saved_data["block"] = block;
    ctx->saved_data["output"] = output;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto* p = reinterpret_cast<SegmentProfiler*>(static_cast<intptr_t>(ctx->saved_data["p"].toInt()));
    const int block = static_cast<int>(ctx->saved_data["block"].toInt());
    (ctx->saved_data["output"].toBool() ? p->bwd_start_ : p->bwd_end_)[block] = SegmentProfiler::Clock::now();
    return {g[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void SegmentProfiler::reset() {
  totals_.clear();
  bwd_start_.clear();
  bwd_end_.clear();
}

at::Tensor SegmentProfiler::mark(const at::Tensor& x, int block, bool block_output) {
  if (!x.requires_grad()) return x;
  return ProfileMark::apply(x, this, static_cast<int64_t>(block), block_output);
}

void SegmentProfiler::collect_backward() {
  for (const auto& [block, start] : bwd_start_) {
    auto end = bwd_end_.find(block);
    if (end == bwd_end_.end()) continue;
    add(fmt::format("backward block {:02d}", block), std::chrono::duration<double>(end->second - start).count());
  }
  bwd_start_.clear();
  bwd_end_.clear();
}

std::string SegmentProfiler::table(int steps) const {
  double total = 0;
  for (const auto& [k, v] : totals_) total += v;
  std::ostringstream os;
  os << fmt::format("{:<24} {:>12} {:>7}\n", "segment", "ms/step", "share");
  for (const auto& [k, v] : totals_) {
    os << fmt::format("{:<24} {:>12.2f} {:>6.1f}%\n", k, 1e3 * v / steps, total > 0 ? 100 * v / total : 0);
  }
  os << fmt::format("{:<24} {:>12.2f}\n", "total (timed)", 1e3 * total / steps);
  return os.str();
}

}  // namespace meshtrain
