#include "meshtrain/plan/search.h"

#include <map>
#include <regex>

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "meshtrain/plan/explain.h"

namespace meshtrain::plan {
std::vector<int> divisors(int n, int64_t limit) {
  std::vector<int> d;
  for (int i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

namespace {

Strategy base_strategy(const SearchInput& in) {
  Strategy s;
  s.seq = in.seq;
  s.global_batch = in.global_batch;
  s.precision = in.precision;
  s.bf16_optimizer = in.fixed.bf16_optimizer;
  s.fp8_params = in.fixed.fp8_params;
  return s;
}

}  // namespace

SearchResult search(const SearchInput& in) {
  validate(in.model);
  if (in.gpus < 1) throw std::invalid_argument(fmt::format("--gpus {} must be at least 1", in.gpus));
  if (in.global_batch < 1) throw std::invalid_argument(fmt::format("--global-batch {} must be at least 1", in.global_batch));
  if (in.seq < 0) throw std::invalid_argument(fmt::format("--seq {} must be positive", in.seq));
  validate_weight_storage(in.precision, in.fixed.bf16_optimizer, in.fixed.fp8_params);
  const Fixed& f = in.fixed;
  const int fixed_product = f.tp.value_or(1) * f.pp.value_or(1) * f.cp.value_or(1) * f.ep.value_or(1) * f.dp.value_or(1);
  if (in.gpus % fixed_product != 0) {
    throw std::invalid_argument(fmt::format("--gpus {} is not divisible by the fixed sizes' product {}", in.gpus,
                                            fixed_product));
  }
  SearchResult r;
  std::vector<Candidate> all;                // every valid candidate, for the explanation
  std::map<std::string, int> rejected;      // validate()'s reason, numbers elided: how many combinations
  const int per_node = in.gpu.per_node;
  std::vector<int> eps = in.model.moe() ? divisors(static_cast<int>(in.model.experts), in.gpus) : std::vector<int>{1};
  for (int tp : choices(f.tp, divisors(in.gpus, per_node)))
    for (int cp : choices(f.cp, std::vector<int>{1, 2, 4, 8, 16}))
      for (int ep : choices(f.ep, eps))
        for (int pp : choices(f.pp, divisors(in.gpus, static_cast<int>(in.model.layers)))) {
          if (in.gpus % (tp * cp * ep * pp) != 0) continue;
          const int dp = in.gpus / (tp * cp * ep * pp);
          if (f.dp && *f.dp != dp) continue;
          for (int vpp : choices(f.vpp, std::vector<int>{1, 2}))
            for (int zero : choices(f.zero, std::vector<int>{0, 1, 2, 3}))
              for (Recompute rc : choices(f.recompute, {Recompute::None, Recompute::Selective, Recompute::Full}))
                for (int64_t mb : choices(f.micro_batch, std::vector<int64_t>{1, 2, 4, 8})) {
                  Strategy s = base_strategy(in);
                  s.tp = tp, s.cp = cp, s.ep = ep, s.dp = dp, s.pp = pp, s.vpp = vpp;
                  s.sp = tp > 1 && f.sp.value_or(true);
                  s.offload = f.offload.value_or(false);
                  s.flash = f.flash.value_or(in.gpu.flash_kernels);
                  s.zero = zero;
                  s.recompute = rc;
                  s.sac_op = f.sac_op && rc == Recompute::Selective;
                  s.micro_batch = mb;
                  s.schedule = vpp > 1 ? Schedule::Interleaved : Schedule::OneFOneB;
                  if (vpp > 1 && pp == 1) continue;
                  // With flash attention selective recomputation has nothing left to recompute: it is "none".
                  // Not so torchtitan's per-op policy, which recomputes matmuls.
                  if (s.flash && rc == Recompute::Selective && !f.recompute && !s.sac_op) continue;
                  try {
                    validate(s, in.model);
                  } catch (const std::invalid_argument& e) {
                    ++rejected[std::regex_replace(e.what(), std::regex("[0-9]+"), "N")];
                    continue;
                  }
                  ++r.considered;
                  Candidate c;
                  c.strategy = s;
                  c.memory = memory_ledger(in.model, s, in.memory);
                  c.peak_bytes = c.memory.peak().device_total();
                  c.estimate = estimate_step(in.model, s, in.gpu, in.estimate);
                  if (!r.leanest || c.peak_bytes < r.leanest->peak_bytes) r.leanest = c;
                  if (c.peak_bytes <= in.gpu.memory_bytes) r.ranked.push_back(c);
                  all.push_back(std::move(c));
                }
        }
  r.feasible = static_cast<int>(r.ranked.size());
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    return a.estimate.step_s < b.estimate.step_s;
  });
  explain(in, all, r);
  // The rules as applied, for --explain.
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
    return out;
  };
  r.rules.push_back(fmt::format("tp inside one node: divisors of the GPU count up to {} per node: {}{}", per_node,
                                list(divisors(in.gpus, per_node)), f.tp ? fmt::format(" (fixed: {})", *f.tp) : ""));
  r.rules.push_back(f.sp.value_or(true)
                        ? "sequence parallelism whenever tp > 1 (the same bytes as tp's all-reduce, activations split)"
                        : "no sequence parallelism (--no-sp): tp all-reduces, norms and dropout whole on every tp rank");
  r.rules.push_back("mesh order tp, cp, ep, dp, pp: the most frequent traffic on the fastest link");
  r.rules.push_back(f.flash.value_or(in.gpu.flash_kernels)
                        ? "flash attention: the scores never materialised (so selective recomputation = none); its "
                          "time at the kernel's measured rate"
                        : "attention materialised: scores, softmax and dropout in memory (--no-flash, or no such kernels)");
  if (f.offload.value_or(false)) {
    r.rules.push_back("optimizer offload (--offload): states and fp32 weights on the host, Adam there; ZeRO 1-3 only");
  }
  if (f.sac_op) {
    r.rules.push_back("selective recomputation is torchtitan's per-op policy (--sac-op): each block keeps its input, "
                      "every other matmul's output and the attention kernel's; the rest re-run in its backward");
  }
  if (in.estimate.time.eager_elementwise) {
    r.rules.push_back("elementwise ops as eager PyTorch runs them (--eager): each norm, rotary embedding, GQA copy, "
                      "activation and residual add its own passes over memory");
  }
  r.rules.push_back(fmt::format("pp: divisors of the GPU count up to the {} layers; v in 1,2 (interleaved) when pp > 1",
                                in.model.layers));
  r.rules.push_back("cp in 1,2,4,8,16; ep: divisors of the expert count; zero 0-3; recomputation none, selective, "
                    "full; micro-batch 1,2,4,8; dp = the GPUs left");
  r.rules.push_back(fmt::format("{} valid combinations; {} fit in {} and are ranked by estimated step time",
                                r.considered, r.feasible, human_bytes(in.gpu.memory_bytes)));
  for (const auto& [why, n] : rejected) r.rules.push_back(fmt::format("rejected {} x: {}", n, why));
  return r;
}

}  // namespace meshtrain::plan
