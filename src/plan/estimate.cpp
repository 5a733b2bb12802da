#include "meshtrain/plan/estimate.h"

#include <algorithm>

namespace meshtrain::plan {

bool axis_crosses_nodes(const Strategy& s, const std::string& axis, int per_node) {
  const std::pair<const char*, int> order[] = {{"tp", s.tp}, {"cp", s.cp}, {"ep", s.ep}, {"dp", s.dp}, {"pp", s.pp}};
  int stride = 1;
  for (const auto& [name, size] : order) {
    if (axis == name) return size > 1 && (stride * size > per_node || per_node % (stride * size) != 0);
    stride *= size;
  }
  return true;
}

double bubble_fraction(const Strategy& s) {
  if (s.pp == 1) return 0;
  const double p = s.pp, m = static_cast<double>(s.microbatches());
  switch (s.schedule) {
    case Schedule::GPipe:
    case Schedule::OneFOneB: return (p - 1) / m;
    case Schedule::Interleaved: return (p - 1) / (s.vpp * m);
    case Schedule::ZBH1: return (p - 1) / (3 * m);
  }
  return 0;
}

StepEstimate estimate_step(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, const EstimateOptions& o) {
  validate(s, m);
  StepEstimate e;
  const int64_t seq = s.seq > 0 ? s.seq : m.seq;
  const double tokens = static_cast<double>(s.global_batch) * seq;
  const double per_token = train_flops_per_token(m, seq, o.attn);
  e.model_flops = per_token * tokens;
  // Recomputation re-runs forward work: all of it (full) or the attention core (selective).
  const double fwd = per_token / 3;
  double extra = 0;
  if (s.recompute == Recompute::Full) extra = fwd;
  if (s.recompute == Recompute::Selective && !s.flash) {
    extra = (o.attn == AttnFlops::Full ? 4.0 : 2.0) * m.layers * seq * m.heads * m.head_dim();
  }
  e.hardware_flops = (per_token + extra) * tokens;
  e.compute_s = e.hardware_flops / s.world() / (gpu.peak_flops * o.achievable);
  e.bubble_fraction = bubble_fraction(s);
  e.bubble_s = e.compute_s * e.bubble_fraction;

  const double mb = static_cast<double>(s.microbatches()), b = static_cast<double>(s.micro_batch);
  const double sl = static_cast<double>(seq) / s.cp, h = m.hidden;
  const double layers = static_cast<double>(m.layers) / s.pp;
  const double act = 2;  // 16-bit activations
  auto ring = [](int n) { return n > 1 ? (n - 1.0) / n : 0.0; };
  e.traffic["tp"].bytes = layers * mb * 4 * 2 * ring(s.tp) * b * sl * h * act;
  e.traffic["cp"].bytes = layers * mb * 3 * (s.cp - 1) * 2 * b * sl * m.kv_heads * m.head_dim() * act;
  // Expert parallelism: per MoE layer and micro-batch, the dispatch and the combine forward and backward each
  // move k ring(ep) of the b s rows away and as many in (moe/layer.h; plan/traffic.h counts the same).
  const ParamCount c = count_params(m, 128 * s.tp);
  const double moe_layers = static_cast<double>(c.moe_layers) / s.pp;
  e.traffic["ep"].bytes = m.moe() ? moe_layers * mb * 4 * ring(s.ep) * b * sl * m.top_k * h * act : 0;
  e.traffic["pp"].bytes = s.pp > 1 ? mb * s.vpp * 2 * b * sl * h * act / (s.sp ? s.tp : 1) : 0;
  // Data parallel: the parameters of one rank (most loaded stage, roughly total / (tp pp)): dense ones
  // reduced over dp x cp x ep, routed experts (split over ep, whole on every tp rank) over dp x cp.
  const double expert_total = static_cast<double>(c.moe_layer.expert * c.moe_layers);
  const double dense = (static_cast<double>(c.total) - expert_total) / (s.tp * s.pp);
  const double experts = expert_total / (s.ep * s.pp);
  // Gradients are reduced in fp32 (DESIGN.md); parameters gathered in their own dtype.
  const double pb = s.precision == Precision::Fp32 ? 4 : 2;
  auto reduce = [&](double params, int n) {
    double dp = 0;
    if (s.zero == 0) dp = 2 * ring(n) * params * 4;
    else if (s.zero <= 2) dp = ring(n) * params * 4 + ring(n) * params * pb;
    else dp = ring(n) * params * 4 + 2 * ring(n) * params * pb;
    if (s.dp_shard > 0 && s.dp / s.dp_shard > 1) dp += 2 * ring(s.dp / s.dp_shard) * params / s.dp_shard * 4;
    return dp;
  };
  e.traffic["dp"].bytes = reduce(dense, s.shard_group() * s.cp * s.ep) + reduce(experts, s.shard_group() * s.cp);

  double exposed = 0;
  for (auto& [axis, t] : e.traffic) {
    t.inter_node = axis_crosses_nodes(s, axis, gpu.per_node);
    t.seconds = t.bytes / (t.inter_node ? gpu.inter_node_bw : gpu.intra_node_bw);
    if (axis == "dp") exposed += std::max(0.0, t.seconds - e.compute_s * 2.0 / 3.0);
    else exposed += t.seconds;
  }
  e.exposed_comm_s = exposed;
  e.step_s = e.compute_s + e.bubble_s + exposed;
  e.tokens_per_s = tokens / e.step_s;
  e.mfu = e.model_flops / (e.step_s * s.world() * gpu.peak_flops);
  return e;
}

}  // namespace meshtrain::plan
