// The output layer and its cross-entropy fused, a chunk of tokens at a time
// (the approach of Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024,
// arXiv 2410.10989 sec. 3.2): for each chunk of rows the logits x Wᵀ are
// computed, reduced to the loss and turned into their gradient at once, and
// dropped; the full [tokens, V] logits never exist, let alone the several
// copies (logits, log-probabilities, their gradient) of the unfused pair.
//
// Vocabulary-parallel as parallel/tensor/cross_entropy.h: W is this tp rank's
// slice of the (padded) vocabulary starting at `vocab_start`; per chunk one
// all-reduce (max) and one of [sum of exponentials; target logit] over tp,
// the same bytes as the unfused op's three. Padded ids (>= `vocab`) never
// count.
//
// Gradients. The forward computes, for the rows it sees,
//   G = softmax(logits) - onehot(target)   (rows with target < 0: 0)
//   dX = G W,  dW = Gᵀ X                    (accumulated over chunks)
// which are the gradients for an upstream gradient of 1 per token. When the
// backward's upstream gradient is the same value c on every counted token
// (a summed or averaged loss: pretraining, SFT) it returns c dX and c dW, so
// the step's matrix multiplies are those of the unfused pair (no logits
// recomputed). Any other upstream gradient (per-sequence weights: DPO,
// policy gradients) recomputes each chunk's logits from the saved lse and
// weights the rows: slower, exact either way.
//
// Precision: matrix multiplies in autocast's dtype when autocast is on (else
// in x's), softmax and the loss in fp32, dW accumulated in W's dtype (fp32).
// Memory between forward and backward: dX [tokens, h] and dW [V/tp, h] of
// W's dtype, plus the chunk's logits during the forward.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace meshtrain {

class Comm;
class TiedGrad;

// x: [N, h] the head's input (already entered into tp); weight: [V/tp, h];
// targets: [N] int64, < 0 ignored (loss 0, no gradient). `chunk_rows` tokens
// per chunk, 0 = default_chunk_rows. Returns the per-token loss [N] in fp32,
// identical on every tp rank. `tied`: weight is also the embedding's, whose lookup
// adds its rows into this loss's dW (tied_grad.h).
at::Tensor fused_linear_cross_entropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                                      Comm& tp, int64_t vocab_start, int64_t vocab, int64_t chunk_rows = 0,
                                      const TiedGrad* tied = nullptr);

// Rows per chunk (plan::fused_loss_chunk_rows): N split evenly into the fewest
// chunks whose fp32 logits (rows x local_vocab x 4 bytes) stay within 64 MiB or
// that have at most `hidden` rows, whichever allows more rows: each chunk reads
// and writes the whole dW [local_vocab, hidden], which fewer rows than hidden
// would not repay.
int64_t default_chunk_rows(int64_t n, int64_t local_vocab, int64_t hidden);

}  // namespace meshtrain
