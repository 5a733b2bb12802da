#include "meshtrain/rl/rollout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {
namespace {

// Whether `row` (its generated tokens so far) ends with one of the stop sequences.
bool ends_with_stop(const std::vector<int64_t>& row, const std::vector<std::vector<int64_t>>& stops) {
  for (const auto& s : stops) {
    if (!s.empty() && row.size() >= s.size() && std::equal(s.rbegin(), s.rend(), row.rbegin())) return true;
  }
  return false;
}

}  // namespace

at::Tensor gather_vocab(Transformer& m, const at::Tensor& logits, int64_t dim) {
  return m.params().tp_size() > 1 ? gather_from_region(logits.contiguous(), m.tp_comm(), dim) : logits;
}

Rollout rollout(Transformer& m, const at::Tensor& prompts, const RolloutOptions& o, const std::vector<uint64_t>& seeds) {
  const SampleOptions& so = o.sample;
  validate(so);
  if (prompts.dim() != 2 || prompts.size(1) < 1 || prompts.size(0) < 1) {
    throw std::invalid_argument("rollout: prompts must be [batch, length >= 1]");
  }
  const int64_t B = prompts.size(0), P = prompts.size(1), N = so.max_new_tokens;
  if (static_cast<int64_t>(seeds.size()) != B) {
    throw std::invalid_argument(fmt::format("rollout: {} seeds for {} rows", seeds.size(), B));
  }
  if (P + N > m.spec().seq) {
    throw std::invalid_argument(fmt::format("rollout: prompt {} + {} new tokens exceeds the model's sequence {}", P, N,
                                            m.spec().seq));
  }
  at::NoGradGuard no_grad;
  std::vector<at::Generator> gens;
  for (uint64_t s : seeds) gens.push_back(at::make_generator<at::CPUGeneratorImpl>(s));
  const int64_t vocab = so.vocab_limit > 0 ? std::min(so.vocab_limit, m.spec().vocab) : m.spec().vocab;
  const double t = so.temperature > 0 ? so.temperature : 1.0;
  // Outputs gathered in plain buffers (element-wise tensor writes cost more than the model here).
  std::vector<int64_t> tokens(static_cast<size_t>(B * N), o.pad), lengths(B, 0);
  std::vector<float> logprobs(static_cast<size_t>(B * N), 0.f), mask(static_cast<size_t>(B * N), 0.f);
  std::vector<std::vector<int64_t>> generated(B);
  std::vector<bool> done(B, N == 0);
  const bool plain = so.temperature > 0 && so.top_k == 0 && so.top_p >= 1;  // the whole softmax, sampled as is
  KVCache cache;
  cache.capacity = P + N;
  at::Tensor next = prompts.to(at::kLong).contiguous();
  for (int64_t i = 0; i < N; ++i) {
    const at::Tensor logits = gather_vocab(m, m.decode(next, cache)[-1], 1).narrow(1, 0, vocab).to(at::kFloat);  // [B, vocab]
    const at::Tensor logp = at::log_softmax(logits / t, -1);
    // Batched picks: argmax, or inverse-CDF sampling with one uniform per row
    // drawn from the row's own generator (so a completion does not depend on its batch).
    at::Tensor picks;
    if (so.temperature == 0) {
      picks = logits.argmax(1).contiguous();
    } else if (plain) {
      std::vector<float> u(B);
      for (int64_t b = 0; b < B; ++b) {
        // A uniform in [0, 1) from the row's generator's next 32 bits (24 of them: a float's mantissa).
        u[b] = static_cast<float>(at::check_generator<at::CPUGeneratorImpl>(gens[b])->random() >> 8) / 16777216.0f;
      }
      const at::Tensor cdf = logp.exp().cumsum(1);
      const at::Tensor target = at::tensor(u, at::kFloat).unsqueeze(1) * cdf.narrow(1, vocab - 1, 1);
      picks = at::searchsorted(cdf, target).squeeze(1).clamp_max(vocab - 1).contiguous();
    }
    const int64_t* pick = picks.defined() ? picks.data_ptr<int64_t>() : nullptr;
    std::vector<int64_t> chosen(B, o.pad);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      const int64_t tok = pick ? pick[b] : sample_token(logits[b], so, gens[b]);
      chosen[b] = tok;
      generated[b].push_back(tok);
      tokens[b * N + i] = tok;
      mask[b * N + i] = 1;
      lengths[b] = i + 1;
      if (tok == so.stop_token || ends_with_stop(generated[b], o.stop_sequences)) done[b] = true;
    }
    const at::Tensor picked = at::tensor(chosen, at::kLong).view({B, 1});
    const at::Tensor lp = logp.gather(1, picked.clamp(0, vocab - 1)).contiguous();
    const float* lpp = lp.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      if (mask[b * N + i] != 0) logprobs[b * N + i] = lpp[b];
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    next = picked;
  }
  Rollout r;
  r.prompt = P;
  r.tokens = at::cat({prompts.to(at::kLong), at::tensor(tokens, at::kLong).view({B, N})}, 1);
  r.logprobs = at::tensor(logprobs, at::kFloat).view({B, N});
  r.mask = at::tensor(mask, at::kFloat).view({B, N});
  r.lengths = at::tensor(lengths, at::kLong);
  return r;
}

at::Tensor completion_logprobs(Transformer& m, const at::Tensor& tokens, int64_t prompt, double temperature,
                               int64_t vocab_limit, bool train) {
  const int64_t vocab = vocab_limit > 0 ? std::min(vocab_limit, m.spec().vocab) : m.spec().vocab;
  const int64_t S = tokens.size(1), N = S - prompt;
  if (prompt < 1 || N < 1) throw std::invalid_argument("completion_logprobs: a prompt and at least one completion token");
  const double t = temperature > 0 ? temperature : 1.0;
  // Position j's logits predict token j + 1: positions P - 1 .. S - 2 predict the completion.
  const at::Tensor logits = gather_vocab(m, m.logits(tokens, train), 2).narrow(0, prompt - 1, N).narrow(2, 0, vocab);  // [N, B, V]
  const at::Tensor logp = at::log_softmax(logits.to(at::kFloat) / t, -1);
  const at::Tensor want = tokens.narrow(1, prompt, N).t().unsqueeze(-1);  // [N, B, 1]
  return logp.gather(2, want).squeeze(-1).t();  // [B, N]
}

}  // namespace meshtrain
