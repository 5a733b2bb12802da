// Token-choice top-k routing for a mixture-of-experts layer (seed 000 article
// 12): which experts each token goes to, with what weight, which assignments
// an expert's capacity drops, and the two router losses.
//
// Scores from the router's logits [T, E]:
//   softmax (Switch, GShard, Mixtral): p = softmax(logits) over the experts;
//     the top k by p; gates = the chosen p, renormalised over the k when k > 1
//     (with k = 1 the gate stays p, so the router still gets a gradient);
//   sigmoid (DeepSeek-V3, arXiv 2412.19437 §2.1.2): s = sigmoid(logits); the
//     top k by s; gates = the chosen s normalised over the k (needs k >= 2).
// Capacity (GShard, arXiv 2006.16668 §2.2): with capacity_factor c > 0 each
// expert takes at most C = ceil(c T k / E) assignments, filled in priority
// order: every token's first choice (in token order), then every second
// choice, ...; an assignment past C is dropped (its gate becomes 0; a token
// with every choice dropped passes through the residual alone). c = 0:
// dropless.
// Losses (scalars, differentiable in the logits):
//   aux (Switch, arXiv 2101.03961 eq. 4, top-k as Megatron-Core):
//     E * sum_e f_e P_e, f_e = assignments to e (before dropping) / (T k),
//     P_e = the mean over tokens of p (softmax) or of s / sum_e s (sigmoid);
//     1 when routing is uniform;
//   z (ST-MoE, arXiv 2202.08906 eq. 5): mean over tokens of logsumexp(logits)^2.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace meshtrain {

enum class RouterKind { Softmax, Sigmoid };
RouterKind parse_router(const std::string& s);  // std::invalid_argument naming the value

struct RouterOptions {
  int64_t experts = 8, top_k = 2;
  RouterKind kind = RouterKind::Softmax;
  double capacity_factor = 0;  // 0: dropless
};

struct Routing {
  at::Tensor expert;      // [T, k] int64: the chosen experts, best first
  at::Tensor gate;        // [T, k]: combine weights (autograd through the logits); 0 where dropped
  at::Tensor kept;        // [T, k] bool: the assignment fits its expert's capacity
  at::Tensor aux_loss;    // scalar
  at::Tensor z_loss;      // scalar
  // What the losses are made of, for a sequence split across ranks (moe/layer.h):
  at::Tensor assigned;     // [E] fp32: assignments per expert before dropping (no gradient)
  at::Tensor density_sum;  // [E]: the sum over tokens of P's per-token distribution
  at::Tensor lse2_sum;     // scalar: the sum over tokens of logsumexp(logits)^2
  at::Tensor per_expert;  // [E] int64: assignments kept per expert
  int64_t capacity = 0;   // per expert (0: dropless)
  int64_t dropped = 0;    // assignments past capacity
};

// Throws std::invalid_argument for logits that are not [T, E], or options the
// rule cannot serve (top_k outside 1..E, sigmoid with top_k 1, c < 0).
Routing route(const at::Tensor& logits, const RouterOptions& o);

}  // namespace meshtrain
