// Rollouts for reinforcement learning (rl/grpo.h): many completions of
// prompts generated at once through one KV cache.
//
// A batch holds prompts of one length P (GRPO's G samples of a prompt, or
// prompts bucketed by length: no padding inside the cache, so positions and
// attention are exactly one sequence's). Each row samples with its own
// generator (its seed), so a row's completion does not depend on its batch;
// a row stops after its stop token or when its completion ends with one of the
// stop sequences (a stop string's token ids), and later positions are filled
// with `pad` and masked out. Per generated token the rollout keeps its
// log-probability under softmax(logits / temperature) (temperature 0: the
// plain softmax), the distribution the training step recomputes
// (completion_logprobs); top-k and top-p truncation is not reflected in it, as
// in TRL.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/model/sampler.h"

namespace meshtrain {

class Transformer;

struct RolloutOptions {
  SampleOptions sample;  // max_new_tokens, temperature, top-k, top-p, stop_token, vocab_limit (seed: per row below)
  std::vector<std::vector<int64_t>> stop_sequences;
  int64_t pad = 0;  // fills a row after it stopped
};

struct Rollout {
  int64_t prompt = 0;   // P
  at::Tensor tokens;    // [B, P + N] int64: prompts, then completions (pad after a stop)
  at::Tensor logprobs;  // [B, N] fp32: each generated token's log-probability (0 where masked)
  at::Tensor mask;      // [B, N] fp32: 1 for generated tokens, through the stop token or sequence
  at::Tensor lengths;   // [B] int64: generated tokens per row
};

// The whole padded vocabulary's logits from this rank's slice along `dim`
// (all-gathered over the model's tp group; the same tensor at tp = 1).
at::Tensor gather_vocab(Transformer& m, const at::Tensor& logits, int64_t dim);

// `prompts` [B, P] (the model tensor-parallel or not; no sequence or context
// parallelism): every tp rank samples from the gathered logits with the same
// generators, so the ranks agree and a tp 2 rollout is a tp 1 rollout;
// `seeds`: one per row. Throws std::invalid_argument for a bad shape, seeds
// of another count, or P + max_new_tokens beyond the model's sequence.
Rollout rollout(Transformer& m, const at::Tensor& prompts, const RolloutOptions& o, const std::vector<uint64_t>& seeds);

// Log-probabilities [B, N] of tokens[:, P:] under softmax(logits / temperature)
// (temperature 0 counts as 1) over the first `vocab_limit` ids (0: all, as
// the rollout's sample.vocab_limit), recomputed by one forward over the whole
// rows: differentiable when grad mode is on; `train` turns dropout on.
at::Tensor completion_logprobs(Transformer& m, const at::Tensor& tokens, int64_t prompt, double temperature,
                               int64_t vocab_limit = 0, bool train = false);

}  // namespace meshtrain
