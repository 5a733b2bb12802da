// Text generation from a Transformer with a KV cache: temperature, top-k and
// top-p (nucleus, Holtzman et al., arXiv 1904.09751) sampling.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain {

class Transformer;

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 0.8;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;
  int64_t stop_token = -1;   // stop after generating it (-1: never)
  int64_t vocab_limit = 0;   // > 0: only ids below it (a tokenizer smaller than the model's vocabulary)
};

// Throws std::invalid_argument for a negative temperature or top_k, or top_p
// outside (0, 1].
void validate(const SampleOptions& o);

// The next token from logits [vocab] (fp32) with o's temperature, top-k, top-p.
int64_t sample_token(const at::Tensor& logits, const SampleOptions& o, at::Generator& gen);

// Continues `prompt` (tp = 1 model); returns the new tokens. The prompt is
// run once, then one token per step through the cache.
std::vector<int64_t> generate(Transformer& model, const std::vector<int64_t>& prompt, const SampleOptions& o);

}  // namespace meshtrain
