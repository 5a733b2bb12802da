// train.precision = fp8: the transformer blocks' linears through FP8 (nn/fp8.h),
// everything else as bf16. The output layer and the routed experts stay bf16
// (torchtitan's float8 and Transformer Engine's recipes leave the output layer
// out: its logits feed the loss directly and are the most sensitive to rounding).
//
// Delayed scaling's state (each linear's amax history) is part of the training
// state: end_step() keeps it identical on every rank that holds the linear, so
// one rank writes it ("fp8/<linear>.amax_history", [3, history]: input, weight,
// output gradient, newest step first) and a resume on any mesh reads it back.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/nn/fp8.h"

namespace meshtrain {

class Comm;
class Transformer;

class Fp8Training {
 public:
  // Attaches an nn::Fp8Linear to every block linear of `chunks` (this rank's, in
  // model order). `tp`, `cp`: the groups that split one product (nn/fp8.h).
  Fp8Training(nn::Fp8Recipe r, const std::vector<Transformer*>& chunks, Comm& tp, Comm& cp);

  // After each optimizer step's backward, on every rank. Delayed scaling: the
  // step's amaxes MAX-reduced over `tp` and `replicas` (every rank that holds
  // the same layers: dp x cp (x ep)) and pushed into the histories. Collective
  // over both groups; nothing for current scaling.
  void end_step(Comm& tp, Comm& replicas);

  // The histories (delayed scaling; none for current), written by `owner`.
  std::vector<ckpt::Piece> pieces(bool owner) const;
  // The histories the checkpoint has (one written by a current-scaling or a
  // non-FP8 run has none: those linears start afresh). Throws std::invalid_argument
  // when a stored history's length is not train.fp8_history's.
  void load(ckpt::Reader& r);

  const std::vector<std::pair<std::string, std::shared_ptr<nn::Fp8Linear>>>& linears() const { return linears_; }
  // The e4m3 weight copies the last forward made, summed over this rank's linears (--check-plan).
  int64_t weight_copy_bytes() const;

 private:
  nn::Fp8Recipe recipe_;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Fp8Linear>>> linears_;  // "layers.0.attn.q", ...
};

}  // namespace meshtrain
