// One mixture-of-experts FFN (seed 000 article 12): a router, `experts` FFNs
// of which each token runs `top_k` (moe/router.h), computed grouped by expert
// (moe/experts.h), and with expert parallelism the experts split across the
// `ep` group: each rank holds experts [r E/ep, (r + 1) E/ep), and tokens travel
// to their experts and back by all-to-all (dispatch and combine).
//
//   y_t = sum_j gate[t, j] * expert_{e[t, j]}(x_t)      (shared experts and
//   the residual are the block's: model/transformer.h)
//
// Parameters (global names; checkpoints hold every expert, so a run resumes
// on another ep):
//   {prefix}.router.weight [E, h]               replicated
//   {prefix}.experts.w1    [E, f, h]            split over ep along dim 0
//   {prefix}.experts.w3    [E, f, h] (SwiGLU)
//   {prefix}.experts.w2    [E, h, f]
// The experts are not split by tp (Megatron-Core's expert_tensor_parallel 1):
// without sequence parallelism every tp rank computes them on the same tokens
// (replicated, as the norms); with it each tp rank routes its own sequence
// shard, and the router and expert gradients are partial sums over tp.
//
// The router losses reach the gradient without touching the objective: the
// layer's output carries a node whose backward adds coef x weight to each
// loss's gradient (Megatron-Core's MoEAuxLossAutoScaler), so they train under
// every schedule, pipeline included. `weight` is what the step divides each
// micro-batch's share by (1 / (micro-batches x data-parallel replicas)): the
// objective is the mean over them of aux_coef x aux + z_coef x z.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/moe/experts.h"
#include "meshtrain/moe/router.h"
#include "meshtrain/nn/params.h"
#include "meshtrain/plan/spec.h"

namespace meshtrain {

class Comm;

// What a layer's training forwards routed since the last reset (this rank's tokens).
struct MoeStats {
  std::vector<double> tokens;  // [E] assignments kept per expert
  double assignments = 0;      // tokens x top_k
  double dropped = 0;          // past capacity
  double aux = 0, z = 0;       // summed over forwards
  double forwards = 0;         // under sequence parallelism each tp rank counts 1 / tp
  void reset();
};

class MoeLayer {
 public:
  // `ep`: null or size 1 holds every expert. `sequence_group`: the tp group
  // when the layer sees a tp rank's sequence shard (sequence parallelism; null
  // otherwise): router and expert gradients are then partial sums over it, and
  // the router losses are computed over the whole sequence (layer.cpp).
  // `index`: the layer's place among the model's MoE layers (metrics).
  MoeLayer(ParamStore& store, const std::string& prefix, const plan::ModelSpec& spec, Comm* ep, Comm* sequence_group,
           int64_t index = 0);

  // x [..., h] -> the routed experts' output, same shape. `loss_weight` > 0:
  // a training forward (stats recorded, router losses attached; see above).
  at::Tensor forward(const at::Tensor& x, double loss_weight);

  MoeStats& stats() { return stats_; }
  // Since construction, for --check-plan (plan/traffic.h): forward calls,
  // those that built a graph (their exchanges run again in backward), and the
  // rows each moved to and from other ep ranks in its dispatch.
  struct Exchanges {
    int64_t forwards = 0, backwards = 0, rows_forward = 0, rows_backward = 0;
  };
  const Exchanges& exchanges() const { return exchanges_; }
  const ExpertWeights& weights() const { return w_; }
  const at::Tensor& router_weight() const { return router_; }
  int64_t experts() const { return opts_.experts; }
  int64_t index() const { return index_; }

 private:
  RouterOptions opts_;
  double aux_coef_, z_coef_;
  Comm* ep_;
  Comm* sequence_;
  int64_t index_;
  at::Tensor router_;
  ExpertWeights w_;
  MoeStats stats_;
  Exchanges exchanges_;
};

}  // namespace meshtrain
