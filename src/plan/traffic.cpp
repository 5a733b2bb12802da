#include "meshtrain/plan/traffic.h"

#include "meshtrain/plan/count.h"

namespace meshtrain::plan {

RankTraffic rank_traffic(const ModelSpec& m, const Strategy& s, int pp_rank, const std::vector<StageRange>& chunks,
                         double remote_rows) {
  const ParamCount c = count_params(m, 128 * s.tp);
  const double t = s.tp;
  const bool first = pp_rank == 0, last = pp_rank == s.pp - 1;  // hold stage 0 / stage pp x v - 1
  const double act = s.precision == Precision::Fp32 ? 4 : 2;
  const double b = static_cast<double>(s.micro_batch), sl = static_cast<double>(s.seq > 0 ? s.seq : m.seq) / s.cp;
  const double T = b * sl * m.hidden * act, M = static_cast<double>(s.microbatches());
  auto ring = [](double n) { return n > 1 ? (n - 1) / n : 0.0; };
  RankTraffic r;
  // Parameters on this rank: dense ones (U0 of them outside the layers) and
  // routed experts (MoE layers: their ep share, whole on every tp rank).
  double u0 = 0, dense = 0, experts = 0, units = 0, partial = 0, moe = 0, layers = 0;
  const double redo = s.recompute == Recompute::Full ? 1 : 0;
  for (const StageRange& range : chunks) {
    for (int64_t i = range.first; i < range.last; ++i) {
      const LayerParams& l = c.of(m, i);
      dense += static_cast<double>(l.tp_sharded) / t + static_cast<double>(l.tp_replicated);
      experts += static_cast<double>(l.expert) / s.ep;
      // tp collectives: 4 per sub-block that tp splits (2 forward, 2 backward; + 2 recomputed):
      // attention, and the FFN unless it is a MoE layer without shared experts.
      const bool ffn = !m.moe_layer(i) || m.shared_experts > 0;
      units += (4 + 2 * redo) * (ffn ? 2 : 1);
      // Sequence parallelism leaves partial sums of the replicated parameters
      // (norms, row-parallel biases, the router) and of the experts, which
      // route each tp rank's sequence shard.
      partial += static_cast<double>(l.tp_replicated) + static_cast<double>(l.expert) / s.ep;
      moe += m.moe_layer(i) ? 1 : 0;
      layers += 1;
    }
  }
  if (first) u0 += c.embedding / t + c.positions;
  if (last) u0 += c.final_norm + (m.tied ? (first ? 0 : c.embedding / t) : c.head / t);
  r.params = dense + u0 + experts;
  r.expert_params = experts;

  // A MoE step's metrics (moe/metrics.h): one sum of L_moe x (E + 5) doubles
  // over every group whose ranks saw different tokens.
  const double moe_stats = m.moe() ? 8.0 * static_cast<double>(c.moe_layers) * (m.experts + 5) : 0;
  units += (first ? 2 : 0) + (last ? 2 : 0);
  r.tp = M * ring(t) * (units * T + (last ? 3 * 2 * b * sl * 4 : 0));
  if (s.sp) {
    // Once per step: the partial gradients (above, + positions and the final
    // norm) all-reduced in fp32; per micro-batch and MoE layer the sequence's
    // assignments per expert (fp32 [E], moe/layer.cpp's router losses); the
    // MoE metrics.
    partial += (first ? c.positions : 0) + (last ? c.final_norm : 0);
    r.tp += 2 * ring(t) * (4 * partial + M * moe * 4 * m.experts + moe_stats);
  }

  if (s.pp > 1) {
    const double sends = 2.0 * static_cast<double>(chunks.size()) - (first ? 1 : 0) - (last ? 1 : 0);
    // + the loss (8 bytes), the gradient norm's three sums of squares (24), the MoE metrics
    r.pp = M * sends * T / (s.sp ? t : 1) + 2 * ring(s.pp) * (32 + moe_stats);
    if (m.tied && (first || last)) r.embedding = 2 * ring(2) * 4 * c.embedding / t;
  }

  // Expert parallelism, per MoE layer and micro-batch (moe/layer.h): the
  // counts (E / ep int64 from each other rank), then the dispatch and the
  // combine, which together move the rows this rank sends to and receives
  // from the other ep ranks, `remote_rows` (uniform routing sends k (ep - 1)
  // / ep of each of its T = b s (/ tp with SP) rows' copies away and receives
  // as many), h wide. Forward once (twice with full recomputation), backward
  // once.
  if (m.moe() && s.ep > 1) {
    const double rows_t = b * sl / (s.sp ? t : 1);
    const double remote = remote_rows >= 0 ? remote_rows : 2 * rows_t * m.top_k * ring(s.ep);
    const double counts = ring(s.ep) * m.experts * 8;
    r.ep = M * moe * ((1 + redo) * (counts + remote * m.hidden * act) + remote * m.hidden * act);
    if (s.zero == 0) r.ep += 2 * ring(s.ep) * 8;  // the experts' sum of squares for the gradient norm
  }

  // Context parallelism: per layer and micro-batch, with kv = b (g/t) sl d
  // elements of K (or V) on this rank and f forward passes (2 with recomputation):
  //   ring       f (cp-1) 2kv act forward + (cp-1) 2kv act + cp 2kv 4 (fp32 dK/dV) backward
  //   ulysses    (f + 1) ring(cp) (2 hq + 2 g') b sl d act / t, g' = g, or hq when
  //              each tp rank's kv heads do not divide by cp (repeated)
  //   allgather  (f + 1) ring(cp) 2 cp kv act (all-gather forward, reduce-scatter back)
  if (s.cp > 1) {
    const double cp = s.cp, d = static_cast<double>(m.head_dim()), hq = static_cast<double>(m.heads);
    const double g = static_cast<double>(m.kv_heads), kv = b * (g / t) * sl * d;
    const double f = s.recompute == Recompute::None ? 1 : 2;
    double per_layer = 0;
    if (s.cp_impl == CpImpl::Ring) {
      per_layer = f * (cp - 1) * 2 * kv * act + (cp - 1) * 2 * kv * act + cp * 2 * kv * 4;
    } else if (s.cp_impl == CpImpl::Ulysses) {
      const double g_sent = static_cast<int64_t>(g / t) % s.cp == 0 ? g : hq;
      per_layer = (f + 1) * ring(cp) * (2 * hq + 2 * g_sent) * b * sl * d * act / t;
    } else {
      per_layer = (f + 1) * ring(cp) * 2 * cp * kv * act;
    }
    r.cp = M * layers * per_layer;
  }

  // The gradient reduction groups: dense parameters over dp x cp (x ep: ep
  // ranks read different data), routed experts over dp x cp (the ranks
  // holding the same experts); cp ranks hold the same weights.
  const double D = static_cast<double>(s.dp) * s.cp * s.ep, De = static_cast<double>(s.dp) * s.cp;
  const double scalars = 2 * ring(D) * (16 + moe_stats);  // token count and loss, the MoE metrics
  const double pb = s.zero == 3 && s.precision == Precision::Bf16 ? 2 : 4;
  // P parameters (U of them outside the layers) reduced over a group of G ranks.
  auto reduce = [&](double P, double U, double G) {
    const double n = s.dp_shard > 0 ? s.dp_shard : G, R = G / n;
    if (s.zero == 0) return 2 * ring(G) * 4 * P;
    const double reductions = s.zero == 1 ? 1 : M;
    double bytes = reductions * (ring(n) * 4 * P + 2 * ring(R) * 4 * P / n);
    return bytes + (s.zero == 3 ? M * ring(n) * pb * (2 * P - U) : ring(n) * 4 * P);
  };
  r.dp = reduce(dense + u0, u0, D) + reduce(experts, 0, De) + scalars;
  if (s.zero > 0) r.dp += 2 * ring(s.dp_shard > 0 ? s.dp_shard : D) * 24;  // the gradient norm's sums
  return r;
}

}  // namespace meshtrain::plan
