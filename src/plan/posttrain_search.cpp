#include "meshtrain/plan/posttrain_search.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "meshtrain/plan/count.h"
#include "meshtrain/plan/op_time.h"

namespace meshtrain::plan {
namespace {

const std::pair<const char*, PostTrainMethod> kMethods[] = {
    {"sft", PostTrainMethod::Sft},   {"dpo", PostTrainMethod::Dpo}, {"lora", PostTrainMethod::Lora},
    {"qlora", PostTrainMethod::Qlora}, {"ppo", PostTrainMethod::Ppo}, {"grpo", PostTrainMethod::Grpo}};

LoraOptions lora_of(const PostTrainInput& in) {
  LoraOptions o = in.lora;
  o.qlora = in.method == PostTrainMethod::Qlora;
  return o;
}

// DPO's forward holds both sequences of every pair.
Strategy pairs_as_sequences(Strategy s) {
  s.micro_batch *= 2;
  s.global_batch *= 2;
  return s;
}

// `L` with `extra` before its reserve line, the reserve recomputed as memory.cpp computes it.
StageLedger with_line(StageLedger L, const LedgerLine& extra, const MemoryOptions& o) {
  L.lines.erase(std::remove_if(L.lines.begin(), L.lines.end(), [](const LedgerLine& l) { return l.item == "reserve"; }),
                L.lines.end());
  L.lines.push_back(extra);
  L.lines.push_back(reserve_line(L.device_total(), o));
  return L;
}

// Seconds of a forward over the step's tokens: a third of the training FLOPs at the step's compute rate.
double forward_seconds(const StepEstimate& e) { return e.compute_s * (e.model_flops / 3) / e.hardware_flops; }

double weight_bytes(const Strategy& s) { return s.precision == Precision::Fp32 ? 4 : 2; }

// One rollout on one rank: prefill of rollout_batch prompts, then one decoding step per generated token that
// reads the model's weights (split over tp; pipeline stages decode in series) and the KV cache so far.
double rollout_seconds(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, const RlhfOptions& o) {
  const double active = static_cast<double>(count_params(m).matmul_active), wb = weight_bytes(s);
  const double batch = static_cast<double>(o.rollout_batch);
  const double prefill = 2 * active / s.tp * batch * o.prompt_tokens / (gpu.peak_flops * gpu.matmul_efficiency);
  const double weights = static_cast<double>(count_params(m).total) / s.tp * wb;
  const double kv_per_token = 2.0 * m.layers * m.kv_heads * m.head_dim() * wb / s.tp;
  const double mean_context = o.prompt_tokens + o.generated_tokens / 2.0;
  return prefill + o.generated_tokens * memory_seconds(weights + kv_per_token * batch * mean_context, gpu);
}

}  // namespace

PostTrainMethod post_train_method(const std::string& name) {
  for (const auto& [n, m] : kMethods)
    if (name == n) return m;
  throw std::invalid_argument(
      fmt::format("unknown --method '{}'; use pretrain, sft, dpo, lora, qlora, ppo or grpo", name));
}

bool lora_method(PostTrainMethod m) { return m == PostTrainMethod::Lora || m == PostTrainMethod::Qlora; }

std::string to_string(PostTrainMethod method) {
  for (const auto& [n, m] : kMethods)
    if (m == method) return n;
  return "?";
}

StageLedger post_train_ledger(const PostTrainInput& in, const Strategy& s) {
  const ModelSpec& m = in.search.model;
  switch (in.method) {
    case PostTrainMethod::Sft: return memory_ledger(m, s, in.search.memory).peak();
    case PostTrainMethod::Dpo: {
      StageLedger L = memory_ledger(m, pairs_as_sequences(s), in.search.memory).peak();
      if (!in.reference) return L;
      const double psi = static_cast<double>(count_params(m).total) / (s.tp * s.pp);
      return with_line(L,
                       {"reference (frozen)", psi * weight_bytes(s),
                        fmt::format("{:.4g} params x {:.0f} B, weights only", psi, weight_bytes(s))},
                       in.search.memory);
    }
    case PostTrainMethod::Lora:
    case PostTrainMethod::Qlora: return lora_ledger(m, s, lora_of(in));
    case PostTrainMethod::Ppo: return rlhf_ledger(m, s, in.rl);
    case PostTrainMethod::Grpo: return grpo_ledger(m, s, in.rl, in.reference);
  }
  return {};
}

double post_train_step_seconds(const PostTrainInput& in, const Strategy& s) {
  const ModelSpec& m = in.search.model;
  const GpuSpec& gpu = in.search.gpu;
  const EstimateOptions& eo = in.search.estimate;
  if (in.method == PostTrainMethod::Dpo) {
    const StepEstimate e = estimate_step(m, pairs_as_sequences(s), gpu, eo);
    return e.step_s + (in.reference ? forward_seconds(e) : 0);
  }
  const StepEstimate e = estimate_step(m, s, gpu, eo);
  if (lora_method(in.method)) {
    // The frozen base computes no weight gradients; recomputation's extra forward stays.
    const double tokens = e.model_flops / train_flops_per_token(m, s.seq, eo.attn);
    const double adapter = adapter_train_flops_per_token(m, s.seq, lora_params(m, lora_of(in)), eo.attn) * tokens;
    const double scale = (adapter + e.hardware_flops - e.model_flops) / e.hardware_flops;
    double t = (e.compute_s + e.bubble_s) * scale + e.traffic.at("tp").exposed + e.traffic.at("pp").exposed;
    if (in.method == PostTrainMethod::Qlora) {
      // Every pass (forward, backward, a full recomputation's forward) dequantises the rank's NF4 linears.
      const double passes = s.recompute == Recompute::Full ? 3 : 2;
      const double linear = static_cast<double>(block_linear_weights(m)) / (s.tp * s.pp);
      t += static_cast<double>(s.microbatches()) * passes *
           memory_seconds(linear * (qlora_bits_per_param(in.lora.double_quant) / 8 + 2), gpu);
    }
    return t;
  }
  if (in.method == PostTrainMethod::Ppo || in.method == PostTrainMethod::Grpo) {
    const bool ppo = in.method == PostTrainMethod::Ppo;
    const double trained = ppo ? 2 : 1, frozen = ppo ? 2 : (in.reference ? 1 : 0);
    return trained * e.step_s + frozen * forward_seconds(e) + rollout_seconds(m, s, gpu, in.rl);
  }
  return e.step_s;  // sft
}

PostTrainResult search_post_training(const PostTrainInput& in) {
  const SearchInput& si = in.search;
  const Fixed& f = si.fixed;
  validate(si.model);
  if (si.gpus < 1) throw std::invalid_argument(fmt::format("--gpus {} must be at least 1", si.gpus));
  if (si.global_batch < 1) throw std::invalid_argument(fmt::format("--global-batch {} must be at least 1", si.global_batch));
  validate_weight_storage(si.precision, f.bf16_optimizer, f.fp8_params);
  if (f.cp.value_or(1) != 1 || f.ep.value_or(1) != 1) {
    throw std::invalid_argument(fmt::format("--method {} plans tp, pp, dp, ZeRO, recomputation and the micro-batch; "
                                            "drop --cp and --ep (the post-training ledgers split no sequence and no "
                                            "experts)",
                                            to_string(in.method)));
  }
  // Interleaving, fixed: SFT's ledger and step are pretraining's, which model it; the other methods' are not.
  if (f.vpp.value_or(1) != 1 && in.method != PostTrainMethod::Sft) {
    throw std::invalid_argument(fmt::format("--vpp {} with --method {}: only sft plans an interleaved pipeline (its "
                                            "ledger is pretraining's); drop --vpp",
                                            *f.vpp, to_string(in.method)));
  }
  if (f.offload.value_or(false)) {
    throw std::invalid_argument(fmt::format("--offload plans pretraining's search; the --method {} ledger has no "
                                            "offloaded optimizer",
                                            to_string(in.method)));
  }
  const int fixed_product = f.tp.value_or(1) * f.pp.value_or(1) * f.dp.value_or(1);
  if (si.gpus % fixed_product != 0) {
    throw std::invalid_argument(
        fmt::format("--gpus {} is not divisible by the fixed sizes' product {}", si.gpus, fixed_product));
  }
  PostTrainResult r;
  auto better = [](const PostTrainCandidate& a, const PostTrainCandidate& b) { return a.step_s < b.step_s; };
  for (int tp : choices(f.tp, divisors(si.gpus, si.gpu.per_node)))
    for (int pp : choices(f.pp, divisors(si.gpus, si.model.layers))) {
      if (si.gpus % (tp * pp) != 0) continue;
      const int dp = si.gpus / (tp * pp);
      if (f.dp && *f.dp != dp) continue;
      for (int zero : choices(f.zero, std::vector<int>{0, 1, 2, 3}))
        for (Recompute rc : choices(f.recompute, std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full}))
          for (int64_t mb : choices(f.micro_batch, std::vector<int64_t>{1, 2, 4, 8})) {
            Strategy s;
            s.seq = si.seq, s.global_batch = si.global_batch, s.precision = si.precision;
            s.bf16_optimizer = f.bf16_optimizer, s.fp8_params = f.fp8_params;
            s.tp = tp, s.pp = pp, s.dp = dp, s.zero = zero, s.recompute = rc, s.micro_batch = mb;
            s.vpp = f.vpp.value_or(1);
            if (s.vpp > 1) {
              if (pp == 1) continue;
              s.schedule = Schedule::Interleaved;
            }
            s.sp = tp > 1 && f.sp.value_or(true);
            s.flash = f.flash.value_or(si.gpu.flash_kernels);
            // With flash attention selective recomputation has nothing left to recompute: it is "none".
            if (s.flash && rc == Recompute::Selective && !f.recompute) continue;
            try {
              validate(s, si.model);
            } catch (const std::invalid_argument&) {
              continue;
            }
            ++r.considered;
            PostTrainCandidate c;
            c.strategy = s;
            c.ledger = post_train_ledger(in, s);
            c.peak_bytes = c.ledger.device_total();
            c.step_s = post_train_step_seconds(in, s);
            if (!r.leanest || c.peak_bytes < r.leanest->peak_bytes) r.leanest = c;
            if (!r.fastest || better(c, *r.fastest)) r.fastest = c;
            if (c.peak_bytes <= si.gpu.memory_bytes) r.ranked.push_back(std::move(c));
          }
    }
  r.feasible = static_cast<int>(r.ranked.size());
  std::stable_sort(r.ranked.begin(), r.ranked.end(), better);
  const std::string mem = human_bytes(si.gpu.memory_bytes);
  r.explanation.push_back(fmt::format("{} of {} on {} x {}: {} layouts (tp, pp, ZeRO, recomputation, micro-batch), "
                                      "{} fit in {}",
                                      to_string(in.method), si.model.name, si.gpus, si.gpu.name, r.considered,
                                      r.feasible, mem));
  if (r.ranked.empty()) {
    if (r.leanest) {
      r.explanation.push_back(fmt::format("nothing fits: the leanest, {} with {} recomputation, needs {} per GPU",
                                          r.leanest->strategy.describe(), to_string(r.leanest->strategy.recompute),
                                          human_bytes(r.leanest->peak_bytes)));
    }
    r.explanation.push_back(lora_method(in.method) ? "more GPUs (tp, pp), a shorter sequence, or qlora"
                                                : "more GPUs (tp, pp, ZeRO-3), a shorter sequence, or lora / qlora");
    return r;
  }
  const PostTrainCandidate& best = r.ranked.front();
  r.explanation.push_back(fmt::format("best: {}, recomputation {}, micro-batch {}: {} of {}, {:.3g} s per step",
                                      best.strategy.describe(), to_string(best.strategy.recompute),
                                      best.strategy.micro_batch, human_bytes(best.peak_bytes), mem, best.step_s));
  if (r.fastest->peak_bytes > si.gpu.memory_bytes) {
    r.explanation.push_back(fmt::format(
        "fitting costs {:.0f}% step time: the fastest layout of all ({}, recomputation {}, {:.3g} s) needs {}",
        100 * (best.step_s / r.fastest->step_s - 1), r.fastest->strategy.describe(),
        to_string(r.fastest->strategy.recompute), r.fastest->step_s, human_bytes(r.fastest->peak_bytes)));
  } else {
    r.explanation.push_back("the fastest layout of all fits: fitting costs nothing");
  }
  if (best.strategy.recompute != Recompute::None) {
    Strategy keep = best.strategy;
    keep.recompute = Recompute::None;
    r.explanation.push_back(fmt::format(
        "{} recomputation: {} per GPU where keeping every activation needs {}, for {:.0f}% more step time",
        to_string(best.strategy.recompute), human_bytes(best.peak_bytes),
        human_bytes(post_train_ledger(in, keep).device_total()),
        100 * (best.step_s / post_train_step_seconds(in, keep) - 1)));
  }
  return r;
}

}  // namespace meshtrain::plan
