#include "meshtrain/plan/estimate.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "meshtrain/plan/dp_time.h"
#include "meshtrain/plan/op_time.h"

namespace meshtrain::plan {

namespace {

// The axis's size and stride (the product of the sizes before it) under the mesh order.
std::pair<int, int> axis_size_stride(const Strategy& s, const std::string& axis) {
  const std::pair<const char*, int> order[] = {{"tp", s.tp}, {"cp", s.cp}, {"ep", s.ep}, {"dp", s.dp}, {"pp", s.pp}};
  int stride = 1;
  for (const auto& [name, size] : order) {
    if (axis == name) return {size, stride};
    stride *= size;
  }
  throw std::invalid_argument("unknown mesh axis '" + axis + "'");
}

}  // namespace

bool axis_crosses_nodes(const Strategy& s, const std::string& axis, int per_node) {
  const auto [size, stride] = axis_size_stride(s, axis);
  return size > 1 && (stride * size > per_node || per_node % (stride * size) != 0);
}

int axis_members_per_node(const Strategy& s, const std::string& axis, int per_node) {
  const auto [size, stride] = axis_size_stride(s, axis);
  return stride >= per_node ? 1 : std::max(1, std::min(size, per_node / stride));
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
  if (gpu.peak_flops <= 0 || gpu.memory_bw <= 0) {
    throw std::invalid_argument(fmt::format("device '{}' has no peak FLOP/s or memory bandwidth; `meshtrain plan "
                                            "--gpu cpu` measures this host's",
                                            gpu.name));
  }
  if (s.precision == Precision::Fp8 && gpu.fp8_peak_flops <= 0) {
    throw std::invalid_argument(fmt::format("{} has no fp8 tensor cores (Hopper and later do): plan it in bf16",
                                            gpu.name));
  }
  StepEstimate e;
  const int64_t seq = s.seq > 0 ? s.seq : m.seq;
  const double tokens = static_cast<double>(s.global_batch) * seq;
  const double per_token = train_flops_per_token(m, seq, o.attn);
  e.model_flops = per_token * tokens;
  // Recomputation re-runs forward work: all of it (full) or the attention core (selective).
  const double fwd = per_token / 3;
  double extra = 0;
  if (s.recompute == Recompute::Full) extra = fwd;
  if (s.recompute == Recompute::Selective && s.sac_op && !m.moe()) {
    // torchtitan's per-op policy (strategy.h): the forwards of k, o and w3 (GELU: fc2) again.
    const double h = static_cast<double>(m.hidden), d = static_cast<double>(m.head_dim());
    const double ffn = static_cast<double>(m.ffn);
    extra = 2.0 * m.layers * (h * m.kv_heads * d + m.heads * d * h + ffn * h);
  } else if (s.recompute == Recompute::Selective && !s.flash) {
    extra = (o.attn == AttnFlops::Full ? 4.0 : 2.0) * m.layers * seq * m.heads * m.head_dim();
  }
  e.hardware_flops = (per_token + extra) * tokens;

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
  const double pp_send = b * sl * h * act / (o.time.pp_scatter_gather || s.sp ? s.tp : 1);
  e.traffic["pp"].bytes = s.pp > 1 ? mb * s.vpp * 2 * pp_send : 0;
  // Data parallel: the parameters of one rank (most loaded stage, roughly total / (tp pp)): dense ones
  // reduced over dp x cp x ep, routed experts (split over ep, whole on every tp rank) over dp x cp.
  const double expert_total = static_cast<double>(c.moe_layer.expert * c.moe_layers);
  const double dense = (static_cast<double>(c.total) - expert_total) / (s.tp * s.pp);
  const double experts = expert_total / (s.ep * s.pp);
  // Gradients are reduced in fp32 (DESIGN.md) unless the options say otherwise; parameters gathered in their
  // own dtype.
  const double pb = s.precision == Precision::Fp32 ? 4 : 2;
  const bool fp32_grads = o.time.fp32_grad_reduce || s.precision == Precision::Fp32 || s.precision == Precision::Megatron18;
  const double gb = fp32_grads ? 4 : 2;

  // One micro-batch through each stage: its layers, the embedding on the first, the output layer on the last.
  const TimeOptions& to = o.time;
  const double moe_share = static_cast<double>(c.moe_layers) / m.layers;
  Work layer = layer_work(m, s, gpu, false, to) * (1 - moe_share);
  if (c.moe_layers > 0) layer += layer_work(m, s, gpu, true, to) * moe_share;
  const Work body = layer * layers;
  Work first = body, last = body;
  first += embedding_work(m, s, gpu);
  last += output_work(m, s, gpu, c.vocab_padded);
  if (s.pp == 1) first += output_work(m, s, gpu, c.vocab_padded), last = first;
  e.microbatch = first.total() >= last.total() ? first : last;
  double mean_stage = s.pp == 1 ? first.total() : ((s.pp - 2) * body.total() + first.total() + last.total()) / s.pp;
  if (!to.grad_accumulation_fusion && mb > 1) {
    const double add = memory_seconds(3 * gb * (dense + experts), gpu) * (mb - 1) / mb;
    e.microbatch.memory += add;
    mean_stage += add;
  }

  e.compute_s = mb * e.microbatch.compute();
  e.bubble_fraction = bubble_fraction(s);
  e.bubble_s = e.bubble_fraction * mb * mean_stage;

  // Pipeline sends: forward activation and backward gradient per micro-batch and virtual stage, on the
  // critical path of 1F1B's steady state and of the ramps.
  double pp_s = 0;
  if (s.pp > 1) {
    double send = collective_seconds(Collective::Send, pp_send, 2, axis_link(s, "pp", gpu));
    // Scatter/gather without SP: the receiver all-gathers the tp ranks' pieces over its own tp group before
    // using them (Narayanan et al. 2021, sec. 4.1). With SP the pieces are the activation's own shards.
    if (s.tp > 1 && o.time.pp_scatter_gather && !s.sp) {
      send += collective_seconds(Collective::AllGather, pp_send * s.tp, s.tp, axis_link(s, "tp", gpu));
    }
    pp_s = 2 * (mb * s.vpp + s.pp - 1) * send;
    // Tied embedding: the first and last stages sum their copies' fp32 gradients.
    if (m.tied) pp_s += collective_seconds(Collective::AllReduce, c.embedding / s.tp * 4.0, 2, axis_link(s, "pp", gpu));
  }
  // Data parallel and ZeRO: when each collective runs and what it hides under (plan/dp_time.h).
  const DpTime dp = dp_time(s, dense, experts, gb, pb, e.microbatch.compute(), layers, axis_link(s, "dp", gpu), to);
  e.traffic["dp"].bytes = dp.bytes;
  const double backward_window = kBackwardShare * e.microbatch.compute();  // the offload's copies hide there too
  e.traffic["tp"].seconds = mb * e.microbatch.tp_wire;
  e.traffic["cp"].seconds = mb * e.microbatch.cp_wire;
  e.traffic["ep"].seconds = mb * e.microbatch.ep_wire;
  e.traffic["pp"].seconds = pp_s;
  e.traffic["dp"].seconds = dp.seconds;
  e.traffic["tp"].exposed = mb * e.microbatch.tp;
  e.traffic["cp"].exposed = mb * e.microbatch.cp;
  e.traffic["ep"].exposed = mb * e.microbatch.ep;
  e.traffic["pp"].exposed = pp_s;
  e.traffic["dp"].exposed = dp.exposed;
  e.exposed_comm_s = mb * e.microbatch.comm() + pp_s + dp.exposed;
  // ZeRO shards the optimizer as memory.cpp does: dense parameters over dp x cp x ep, experts over dp x cp.
  const double shard = s.zero >= 1 ? dense / (s.shard_group() * s.cp * s.ep) + experts / (s.shard_group() * s.cp)
                                   : dense + experts;
  e.optimizer_s = optimizer_seconds(dense + experts, shard, s, gpu);
  if (s.offload) {
    if (gpu.pcie_bw <= 0 || gpu.host_memory_bw <= 0) {
      throw std::invalid_argument(fmt::format("{} has no separate host to offload the optimizer to: plan it without "
                                              "offload", gpu.name));
    }
    // The host's Adam replaces the GPU's; gradient copies not hidden under the backward count with it.
    e.offload = offload_time(shard, s, gpu, backward_window, to.dp_overlap);
    e.optimizer_s = e.offload.exposed();
  }
  e.step_s = e.compute_s + e.bubble_s + e.exposed_comm_s + e.optimizer_s;
  for (auto& [axis, t] : e.traffic) t.inter_node = axis_crosses_nodes(s, axis, gpu.per_node);
  e.tokens_per_s = tokens / e.step_s;
  e.mfu = e.model_flops / (e.step_s * s.world() * gpu.peak_flops);
  return e;
}

}  // namespace meshtrain::plan
