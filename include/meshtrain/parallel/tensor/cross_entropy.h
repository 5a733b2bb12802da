// Cross-entropy over vocabulary-parallel logits (Megatron-LM's
// _VocabParallelCrossEntropy): each tp rank holds logits for its slice of the
// (padded) vocabulary; the full logits are never gathered. Three all-reduces of
// one value per token (max, sum of exponentials, target logit) replace a gather
// of V values per token. Padded vocabulary entries (ids >= `vocab`) are masked
// out, so they never change the loss or receive a gradient.
#pragma once

#include <ATen/core/Tensor.h>

namespace meshtrain {

class Comm;

// logits: [..., V/tp] (this rank's slice, starting at vocab id `vocab_start`);
// targets: [...] int64, ids < 0 are ignored (loss 0, no gradient).
// Returns the per-token loss [...] in fp32, identical on every tp rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Comm& tp,
                                        int64_t vocab_start, int64_t vocab);

}  // namespace meshtrain
