// AdamW (Loshchilov & Hutter, arXiv 1711.05101) with fp32 state, parameter
// groups, learning-rate schedules and global gradient-norm clipping.
//
// Update for each parameter p with gradient g at step t (1-based):
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p -= lr * ( m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// (decoupled weight decay, as torch.optim.AdamW). No decay on norms, biases
// and, when asked, embeddings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/nn/params.h"

namespace meshtrain {

class Comm;

enum class LrSchedule { Constant, Linear, Cosine };
LrSchedule parse_lr_schedule(const std::string& s);

struct AdamWOptions {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool decay_embeddings = true;
  LrSchedule schedule = LrSchedule::Cosine;
  int64_t warmup_steps = 0, total_steps = 1;
  double min_lr_ratio = 0.1;  // cosine/linear decay to lr * min_lr_ratio
  double clip_norm = 1.0;     // <= 0: no clipping
  // One pass per fp32 tensor (src/optim/fused_adamw.h: clip, moments, decay and
  // the step together); false: the same update as separate ATen ops.
  bool fused = true;
};

// Learning rate at optimizer step `step` (1-based): linear warmup to lr over
// warmup_steps, then constant, linear or cosine decay to lr * min_lr_ratio at total_steps.
double learning_rate(const AdamWOptions& o, int64_t step);

// Whether a parameter gets weight decay (not norms, biases, or embeddings unless asked).
bool decays(const Param& p, const AdamWOptions& o);

// L2 norm of all gradients, every parameter counted once: shards of tp-split
// parameters are summed over the tp group; replicated ones counted once;
// replicas (Param::replica) not at all. `sum_over`: groups whose ranks hold
// disjoint parts of the model (ZeRO's shard group, the pipeline group): the
// sums of squares are first summed over each. `ep`: the expert-parallel
// group, whose ranks hold different experts (Param::expert): their squares
// are summed over it.
double global_grad_norm(const std::vector<Param>& params, Comm* tp, const std::vector<Comm*>& sum_over = {},
                        Comm* ep = nullptr);

class AdamW {
 public:
  AdamW(std::vector<Param>& params, AdamWOptions o);
  // Clips (when configured), then updates every parameter with a gradient.
  // Returns the gradient norm before clipping. `sum_over`: as in global_grad_norm.
  // The same as update(grad_norm(tp, sum_over)).
  double step(Comm* tp, const std::vector<Comm*>& sum_over = {});
  // The two halves, for a step that may be dropped between them (train/spike.h).
  double grad_norm(Comm* tp, const std::vector<Comm*>& sum_over = {}) const;
  void update(double grad_norm);
  // The expert-parallel group for the gradient norm (global_grad_norm's `ep`).
  void set_expert_group(Comm* ep) { ep_ = ep; }
  int64_t steps() const { return step_; }
  double last_lr() const { return lr_; }
  // State for checkpoints: exp_avg and exp_avg_sq per parameter, in order.
  std::vector<at::Tensor>& exp_avg() { return m_; }
  std::vector<at::Tensor>& exp_avg_sq() { return v_; }
  void set_steps(int64_t s) { step_ = s; }

 private:
  std::vector<Param>& params_;
  AdamWOptions o_;
  std::vector<at::Tensor> m_, v_;
  int64_t step_ = 0;
  double lr_ = 0;
  Comm* ep_ = nullptr;
};

}  // namespace meshtrain
