#include "meshtrain/plan/traffic.h"

#include "meshtrain/plan/count.h"

namespace meshtrain::plan {

RankTraffic rank_traffic(const ModelSpec& m, const Strategy& s, int pp_rank, const std::vector<int64_t>& stage_layers) {
  const ParamCount c = count_params(m, 128 * s.tp);
  const double t = s.tp;
  const bool first = pp_rank == 0, last = pp_rank == s.pp - 1;  // hold stage 0 / stage pp x v - 1
  const double act = s.precision == Precision::Fp32 ? 4 : 2;
  const double b = static_cast<double>(s.micro_batch), sl = static_cast<double>(s.seq > 0 ? s.seq : m.seq) / s.cp;
  const double T = b * sl * m.hidden * act, M = static_cast<double>(s.microbatches());
  auto ring = [](double n) { return n > 1 ? (n - 1) / n : 0.0; };
  RankTraffic r;
  // Parameters on this rank; U0 = those outside the layers.
  double layers = 0, u0 = 0;
  for (int64_t l : stage_layers) layers += static_cast<double>(l);
  if (first) u0 += c.embedding / t + c.positions;
  if (last) u0 += c.final_norm + (m.tied ? (first ? 0 : c.embedding / t) : c.head / t);
  r.params = layers * (c.layer.tp_sharded / t + c.layer.tp_replicated) + u0;

  double units = layers * (8 + (s.recompute == Recompute::Full ? 4 : 0)) + (first ? 2 : 0) + (last ? 2 : 0);
  r.tp = M * ring(t) * (units * T + (last ? 3 * 2 * b * sl * 4 : 0));
  if (s.sp) {
    // Once per step: the gradients sequence parallelism leaves partial (norms,
    // row-parallel biases, positions) are all-reduced in fp32.
    const double partial = layers * c.layer.tp_replicated + (first ? c.positions : 0) + (last ? c.final_norm : 0);
    r.tp += 2 * ring(t) * 4 * partial;
  }

  if (s.pp > 1) {
    const double sends = 2.0 * static_cast<double>(stage_layers.size()) - (first ? 1 : 0) - (last ? 1 : 0);
    r.pp = M * sends * T / (s.sp ? t : 1) + 2 * ring(s.pp) * 24;  // + the loss and the gradient norm's sums
    if (m.tied && (first || last)) r.embedding = 2 * ring(2) * 4 * c.embedding / t;
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

  // The gradient reduction group is dp x cp (cp ranks hold the same weights).
  const double D = static_cast<double>(s.dp) * s.cp;
  const double P = r.params, n = s.dp_shard > 0 ? s.dp_shard : D, R = D / n;
  const double scalars = 2 * ring(D) * 16;  // token count and loss
  const double replicas = 2 * ring(R) * 4 * P / n;
  const double pb = s.zero == 3 && s.precision == Precision::Bf16 ? 2 : 4;
  if (s.zero == 0) {
    r.dp = 2 * ring(D) * 4 * P + scalars;
  } else {
    const double reductions = s.zero == 1 ? 1 : M;
    r.dp = reductions * (ring(n) * 4 * P + replicas) + scalars + 2 * ring(n) * 16;  // + the norm's sums
    r.dp += s.zero == 3 ? M * ring(n) * pb * (2 * P - u0) : ring(n) * 4 * P;
  }
  return r;
}

}  // namespace meshtrain::plan
