#include "meshtrain/rl/grpo_objective.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/rl/rollout.h"

namespace meshtrain {

at::Tensor token_logprobs(Transformer& m, const at::Tensor& tokens, double temperature, int64_t vocab_limit,
                          bool train, at::Tensor* entropy) {
  const int64_t S = tokens.size(1);
  const int64_t vocab = vocab_limit > 0 ? std::min(vocab_limit, m.spec().vocab) : m.spec().vocab;
  const double t = temperature > 0 ? temperature : 1.0;
  const at::Tensor logits = gather_vocab(m, m.logits(tokens, train), 2).narrow(0, 0, S - 1).narrow(2, 0, vocab);  // [S-1, B, V]
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat) / t, -1);
  if (entropy) {
    const at::Tensor lp = logp.detach();
    *entropy = -(lp.exp() * lp).sum(-1).t();  // [B, S-1]
  }
  const at::Tensor next = tokens.narrow(1, 1, S - 1).t().clamp(0, vocab - 1).unsqueeze(-1);
  return logp.gather(2, next).squeeze(-1).t();  // [B, S-1]
}

Batch row_batch(const at::Tensor& tokens, const std::vector<uint64_t>& ids) {
  std::vector<int64_t> idx(ids.begin(), ids.end());
  Batch b;
  b.tokens = tokens.index_select(0, at::tensor(idx, at::kLong));
  b.targets = b.tokens;  // unused by the RL objectives; the step only needs a shape
  b.windows = ids;
  return b;
}

at::Tensor rows_of(const at::Tensor& t, const Batch& b) {
  std::vector<int64_t> idx(b.windows.begin(), b.windows.end());
  return t.index_select(0, at::tensor(idx, at::kLong));
}

Batch GrpoObjective::rows(const std::vector<uint64_t>& ids) const { return row_batch(rollouts_.tokens, ids); }

double GrpoObjective::units(const Batch& b) const {
  const double rows = static_cast<double>(b.windows.size());
  switch (o_.loss) {
    case GrpoLoss::Grpo: return rows;
    case GrpoLoss::DrGrpo: return rows * static_cast<double>(o_.max_completion);
    case GrpoLoss::Dapo:
    case GrpoLoss::Bnpo: break;
  }
  return rows_of(rollouts_.mask, b).sum().item<double>();
}

at::Tensor GrpoObjective::loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) {
  const at::Tensor mask = rows_of(rollouts_.mask, b), old = rows_of(rollouts_.old_logp, b);
  const at::Tensor adv = rows_of(rollouts_.advantages, b);
  at::Tensor entropy;
  const at::Tensor logp = token_logprobs(m, b.tokens, temperature_, vocab_limit_, train, &entropy);
  at::Tensor ref;
  if (o_.beta != 0) {
    at::NoGradGuard no_grad;
    if (reference_) {
      ref = token_logprobs(*reference_, b.tokens, temperature_, vocab_limit_, false);
    } else {
      enable_lora(m, false);
      ref = token_logprobs(m, b.tokens, temperature_, vocab_limit_, false);
      enable_lora(m, true);
    }
  }
  // The step divides by the global units: here the per-token sum (dapo), or each
  // completion's token mean summed (grpo), or the plain sum (dr_grpo's constant denominator).
  GrpoOptions o = o_;
  o.loss = o_.loss == GrpoLoss::Grpo ? GrpoLoss::Grpo : GrpoLoss::Dapo;
  const GrpoTerms t = grpo_loss(logp, old, ref, adv, mask, o, 1.0);
  // Metrics: this micro-batch's token means, weighted by its units (the step divides by the global units).
  const double w = units(b);
  metric_sums.at(0) += t.kl * w;
  metric_sums.at(1) += t.clip_low * w;
  metric_sums.at(2) += t.clip_high * w;
  const double tokens = mask.sum().item<double>();
  metric_sums.at(3) += tokens > 0 ? (entropy * mask).sum().item<double>() / tokens * w : 0;
  // grpo_loss's grpo form is the mean over completions: back to their sum.
  return o.loss == GrpoLoss::Grpo ? t.loss * static_cast<double>(b.windows.size()) : t.loss;
}

}  // namespace meshtrain
