#include "meshtrain/model/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/model/transformer.h"

namespace meshtrain {

void validate(const SampleOptions& o) {
  if (o.temperature < 0 || o.top_k < 0 || !(o.top_p > 0 && o.top_p <= 1) || o.max_new_tokens < 0) {
    throw std::invalid_argument(fmt::format("sampling needs temperature >= 0 (got {}), top-k >= 0 (got {}), top-p in "
                                            "(0, 1] (got {}), tokens >= 0 (got {})",
                                            o.temperature, o.top_k, o.top_p, o.max_new_tokens));
  }
}

int64_t sample_token(const at::Tensor& logits, const SampleOptions& o, at::Generator& gen) {
  at::Tensor l = logits.to(at::kFloat).reshape({-1});
  if (o.temperature == 0) return l.argmax().item<int64_t>();
  l = l / o.temperature;
  if (o.top_k > 0 && o.top_k < l.numel()) {
    const double kth = std::get<0>(l.topk(o.top_k)).min().item<double>();
    l = l.masked_fill(l < kth, -INFINITY);
  }
  if (o.top_p < 1) {
    // Sorted descending, keep tokens while the mass before them is below top_p
    // (so the most likely token always stays).
    auto [sorted, idx] = l.sort(/*dim=*/-1, /*descending=*/true);
    at::Tensor probs = at::softmax(sorted, -1);
    at::Tensor before = probs.cumsum(-1) - probs;
    at::Tensor drop = before >= o.top_p;
    l = l.index_put({idx.masked_select(drop)}, at::full({}, -INFINITY));
  }
  at::Tensor p = at::softmax(l, -1);
  return at::multinomial(p, 1, false, gen).item<int64_t>();
}

std::vector<int64_t> generate(Transformer& model, const std::vector<int64_t>& prompt, const SampleOptions& o) {
  validate(o);
  if (model.params().tp_size() != 1) throw std::invalid_argument("generate() needs a tp = 1 model (load the checkpoint into one)");
  if (prompt.empty()) throw std::invalid_argument("generation needs a prompt of at least one token");
  const int64_t room = model.spec().seq - static_cast<int64_t>(prompt.size());
  if (room < o.max_new_tokens) {
    throw std::invalid_argument(fmt::format("prompt of {} tokens + {} new exceeds the model's maximum sequence {}",
                                            prompt.size(), o.max_new_tokens, model.spec().seq));
  }
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  KVCache cache;
  cache.capacity = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
  at::Tensor next = at::tensor(std::vector<int64_t>(prompt), at::kLong).view({1, -1});
  std::vector<int64_t> out;
  const int64_t vocab = o.vocab_limit > 0 ? std::min(o.vocab_limit, model.spec().vocab) : model.spec().vocab;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    at::Tensor logits = model.decode(next, cache);  // [t, 1, V_pad]
    const int64_t tok = sample_token(logits[-1][0].narrow(0, 0, vocab), o, gen);
    out.push_back(tok);
    if (tok == o.stop_token) break;
    next = at::full({1, 1}, tok, at::kLong);
  }
  return out;
}

}  // namespace meshtrain
