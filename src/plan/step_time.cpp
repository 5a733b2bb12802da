#include "meshtrain/plan/step_time.h"

#include <algorithm>

#include "meshtrain/plan/estimate.h"
#include "meshtrain/plan/op_time.h"

namespace meshtrain::plan {

Work& Work::operator+=(const Work& w) {
  gemm += w.gemm, attention += w.attention, memory += w.memory;
  tp += w.tp, cp += w.cp, ep += w.ep;
  tp_wire += w.tp_wire, cp_wire += w.cp_wire, ep_wire += w.ep_wire;
  return *this;
}

Work Work::operator*(double k) const {
  Work w = *this;
  w.gemm *= k, w.attention *= k, w.memory *= k, w.tp *= k, w.cp *= k, w.ep *= k;
  w.tp_wire *= k, w.cp_wire *= k, w.ep_wire *= k;
  return w;
}

OffloadTime offload_time(double shard_params, const Strategy& s, const GpuSpec& gpu, double backward, bool overlapped) {
  const double pcie = gpu.pcie_bw * gpu.pcie_efficiency;
  const int ranks_per_node = std::min(gpu.per_node, s.world());
  const double host = gpu.host_memory_bw * gpu.memory_efficiency / ranks_per_node;
  const double weight = s.precision == Precision::Fp32 ? 4 : 2;
  const double g = weight * shard_params / pcie;  // one 16-bit (fp32 runs: fp32) copy of the shard's gradients
  const int64_t m = s.microbatches();
  OffloadTime t;
  for (int64_t i = 0; i < m; ++i) {
    double copy = (m > 1 ? g : 0) + (i > 0 ? g : 0);  // accumulation: down, and up from the second on
    if (i == m - 1) copy += 4 * shard_params / pcie;   // the fp32 gradients for the optimizer
    t.copies += copy;
    t.copies_exposed += overlapped ? std::max(0.0, copy - backward) : copy;
  }
  t.host_adam = shard_params * (4 * 4 + 3 * 4 + 4 + weight) / host;
  t.params_up = shard_params * weight / pcie;
  return t;
}

LinkSpec axis_link(const Strategy& s, const std::string& axis, const GpuSpec& gpu) {
  if (!axis_crosses_nodes(s, axis, gpu.per_node)) return gpu.intra;
  LinkSpec link = gpu.inter;
  link.rails = axis_members_per_node(s, axis, gpu.per_node);
  link.rail_limit = gpu.intra.bandwidth * gpu.intra.efficiency;
  return link;
}

namespace {

// One rank's share of a micro-batch.
struct Shape {
  double b, sq, sk, tokens, tokens_sp, h, heads, kv_heads, d, e;
  bool fp8;  // the linears' GEMMs in fp8 (Transformer Engine's recipe); attention stays 16-bit
};

Shape shape_of(const ModelSpec& m, const Strategy& s) {
  const double seq = static_cast<double>(s.seq > 0 ? s.seq : m.seq);
  Shape x;
  x.b = static_cast<double>(s.micro_batch);
  x.sq = seq / s.cp;  // queries on this rank
  x.sk = seq;         // keys each query block meets over the cp ring
  x.tokens = x.b * x.sq;
  x.tokens_sp = s.sp ? x.tokens / s.tp : x.tokens;  // what norms and dropout see
  x.h = static_cast<double>(m.hidden);
  x.heads = static_cast<double>(m.heads) / s.tp;
  x.kv_heads = std::max(1.0, static_cast<double>(m.kv_heads) / s.tp);  // fewer kv heads than tp: replicated
  x.d = static_cast<double>(m.head_dim());
  x.e = s.precision == Precision::Fp32 ? 4 : 2;
  x.fp8 = s.precision == Precision::Fp8;
  return x;
}

// Forward and backward halves of a layer, kept apart for recomputation.
struct Halves {
  Work fwd, bwd;
  double core_fwd = 0;        // attention core forward: its GEMMs (or the flash kernel) and the score passes
  double col_bwd_gemm = 0;    // backward GEMMs of the column-parallel linears (what hides their collectives)
};

// y = x W over `rows` rows, `count` such linears: forward, then dgrad and wgrad.
// fp8 (E4M3 forward, E5M2 gradients, per-tensor scales; Micikevicius et al. arXiv 2209.05433, Transformer
// Engine): all three GEMMs at the fp8 rate on 1-byte operands, and each micro-batch casts the linear's input
// forward and its output gradient backward (read 16-bit, write 8-bit, the amax in the same pass); the
// weights' fp8 copies are cast once per step (optimizer_seconds).
void linear(Halves& l, const Shape& x, const GpuSpec& gpu, double rows, double out, double in, double count = 1,
            bool column = false) {
  if (rows <= 0 || count <= 0) return;
  GpuSpec g = gpu;
  double e = x.e;
  if (x.fp8) {
    g.peak_flops = gpu.fp8_peak_flops, g.matmul_efficiency = gpu.fp8_matmul_efficiency, e = 1;
    l.fwd.memory += count * memory_seconds(3 * rows * in, gpu);
    l.bwd.memory += count * memory_seconds(3 * rows * out, gpu);
  }
  l.fwd.gemm += count * gemm_seconds({rows, out, in}, g, e);
  const double bwd = count * (gemm_seconds({rows, in, out}, g, e) + gemm_seconds({in, out, rows}, g, e));
  l.bwd.gemm += bwd;
  if (column) l.col_bwd_gemm += bwd;
}

void attention_core(Halves& l, const ModelSpec& m, const Strategy& s, const Shape& x, const GpuSpec& gpu) {
  const double batch = x.b * x.heads;
  if (s.flash) {
    const double flops = 4 * batch * x.sq * x.sk * x.d * 0.5;  // Q K^T and P V over the causal half
    const double fwd = flops / flash_rate(gpu, x.sq, x.d);  // blocks of this rank's queries
    l.fwd.attention += fwd;
    l.bwd.attention += 2.5 * fwd;
    l.core_fwd += fwd;
    return;
  }
  const double fwd = gemm_seconds({x.sq, x.sk, x.d, batch}, gpu, x.e) + gemm_seconds({x.sq, x.d, x.sk, batch}, gpu, x.e);
  l.fwd.attention += fwd;
  l.bwd.attention += gemm_seconds({x.sq, x.sk, x.d, batch}, gpu, x.e) + gemm_seconds({x.sk, x.d, x.sq, batch}, gpu, x.e) +
                     gemm_seconds({x.sq, x.d, x.sk, batch}, gpu, x.e) + gemm_seconds({x.sk, x.d, x.sq, batch}, gpu, x.e);
  // Scale + mask + softmax: read and write the scores; dropout: read, write and a 1-byte mask.
  const double scores = batch * x.sq * x.sk;
  const double bytes = 2 * x.e * scores + (m.dropout > 0 ? (2 * x.e + 1) * scores : 0);
  l.fwd.memory += memory_seconds(bytes, gpu);
  l.bwd.memory += 2 * memory_seconds(bytes, gpu);
  l.core_fwd += fwd + memory_seconds(bytes, gpu);
}

void context_comm(Halves& l, const ModelSpec& m, const Strategy& s, const Shape& x, const GpuSpec& gpu) {
  if (s.cp == 1) return;
  const LinkSpec& link = axis_link(s, "cp", gpu);
  const double kv = 2 * x.b * x.sq * x.kv_heads * x.d * x.e;  // this rank's K and V
  switch (s.cp_impl) {
    case CpImpl::Ring: {
      // c-1 hops; each hides behind one of the c blocks of attention; backward sends K, V and dK, dV.
      const double block_f = l.fwd.attention / s.cp, block_b = l.bwd.attention / s.cp;
      const double send_f = collective_seconds(Collective::Send, kv, 2, link);
      const double send_b = collective_seconds(Collective::Send, 2 * kv, 2, link);
      l.fwd.cp += (s.cp - 1) * overlap_cost(send_f, block_f, link);
      l.bwd.cp += (s.cp - 1) * overlap_cost(send_b, block_b, link);
      l.fwd.cp_wire += (s.cp - 1) * send_f;
      l.bwd.cp_wire += (s.cp - 1) * send_b;
      break;
    }
    case CpImpl::Ulysses: {
      // q, k, v to head shards and the output back; the same backward.
      const double qkvo = x.b * x.sq * (2 * x.heads + 2 * x.kv_heads) * x.d * x.e * s.cp;
      l.fwd.cp += collective_seconds(Collective::AllToAll, qkvo, s.cp, link);
      l.bwd.cp += collective_seconds(Collective::AllToAll, qkvo, s.cp, link);
      l.fwd.cp_wire = l.fwd.cp, l.bwd.cp_wire = l.bwd.cp;
      break;
    }
    case CpImpl::AllGather:
      l.fwd.cp += collective_seconds(Collective::AllGather, kv * s.cp, s.cp, link);
      l.bwd.cp += collective_seconds(Collective::ReduceScatter, kv * s.cp, s.cp, link);
      l.fwd.cp_wire = l.fwd.cp, l.bwd.cp_wire = l.bwd.cp;
      break;
  }
  (void)m;
}

void tensor_comm(Halves& l, const Strategy& s, const Shape& x, const GpuSpec& gpu, const TimeOptions& o) {
  if (s.tp == 1) return;
  const LinkSpec& link = axis_link(s, "tp", gpu);
  const double X = x.tokens * x.h * x.e;  // the layer's activation, whole
  double fwd = 0, bwd_row = 0, bwd_col = 0;
  if (s.sp) {
    const double ag = collective_seconds(Collective::AllGather, X, s.tp, link);
    const double rs = collective_seconds(Collective::ReduceScatter, X, s.tp, link);
    fwd = 2 * ag + 2 * rs;
    bwd_row = 2 * ag;            // gradients of o and fc2's outputs gathered
    bwd_col = 2 * ag + 2 * rs;   // inputs of qkv and fc1 gathered again for dW; their input gradients scattered
  } else {
    fwd = 2 * collective_seconds(Collective::AllReduce, X, s.tp, link);
    bwd_col = fwd;  // input gradients of qkv and fc1
  }
  l.fwd.tp_wire += fwd;
  l.bwd.tp_wire += bwd_row + bwd_col;
  if (o.tp_overlap) {
    l.fwd.tp += overlap_cost(fwd, l.fwd.gemm, link);
    l.bwd.tp += overlap_cost(bwd_row + bwd_col, l.bwd.gemm, link);
    return;
  }
  l.fwd.tp += fwd;
  l.bwd.tp += bwd_row + (o.tp_overlap_backward ? overlap_cost(bwd_col, l.col_bwd_gemm, link) : bwd_col);
}

}  // namespace

namespace {

// Forward bytes per token of one dense layer's elementwise ops as eager PyTorch runs torchtitan's Llama (2024-12:
// torchtitan/models/llama/model.py, models/norms.py; 16-bit activations, e bytes, fp32 where the code casts):
//   RMSNorm, twice: x.float(), pow, mean, x * rsqrt, type_as, * weight: (e+4) + 8 + 4 + 8 + (4+e) + 2e = 28 + 4e
//   per element (LayerNorm: ATen's one kernel, read and write);
//   rotary embedding of q and k: .float(), the complex multiply, type_as: (e+4) + 8 + (4+e) per element;
//   repeat_kv (GQA): k and v expanded into a copy per query head: read kv, write q-head width;
//   SDPA's output made contiguous after its transpose: read and write;
//   two residual adds: read two, write one; the activation: SiLU (read, write) and the product (read two, write
//   one) per FFN element (GELU: ATen's one kernel).
double eager_elementwise_bytes(const ModelSpec& m, double e, double h, double q_width, double kv_width,
                               double ffn_elements) {
  const double norm = m.norm == Norm::RMSNorm ? 28 + 4 * e : 2 * e;
  double bytes = 2 * norm * h + 2 * 3 * e * h + 2 * e * q_width;
  if (m.position == Position::RoPE) bytes += (16 + 2 * e) * (q_width + kv_width);
  if (kv_width < q_width) bytes += 2 * (e * kv_width + e * q_width);
  bytes += (m.activation == Activation::SwiGLU ? 5 * e : 2 * e) * ffn_elements;
  return bytes;
}

}  // namespace

Work layer_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, bool moe_layer, const TimeOptions& o) {
  const Shape x = shape_of(m, s);
  Halves l;
  const double t = s.tp;
  linear(l, x, gpu, x.tokens, (x.heads + 2 * x.kv_heads) * x.d, x.h, 1, true);  // q, k, v
  linear(l, x, gpu, x.tokens, x.h, x.heads * x.d);                                // o
  const double gate = m.activation == Activation::SwiGLU ? 2 : 1;
  // The FFN: dense, or a MoE layer's shared experts (one FFN shared x expert_ffn wide) and routed experts.
  double ffn_rows = x.tokens, ffn_width = static_cast<double>(m.ffn) / t, ffn_count = 1;
  if (moe_layer) {
    const double fe = static_cast<double>(m.expert_width());
    const double shared = static_cast<double>(m.shared_experts) * fe / t;
    linear(l, x, gpu, x.tokens, gate * shared, x.h, 1, true);
    linear(l, x, gpu, x.tokens, x.h, shared);
    linear(l, x, gpu, x.tokens, static_cast<double>(m.experts), x.h);  // router
    // Each rank's tokens x top_k routes spread over all experts; a rank holds experts / ep of them.
    ffn_count = static_cast<double>(m.experts) / s.ep;
    ffn_rows = x.tokens * static_cast<double>(m.top_k) * s.ep / static_cast<double>(m.experts);
    ffn_width = fe;
    if (s.ep > 1) {
      const double routed = x.tokens * static_cast<double>(m.top_k) * x.h * x.e;
      const LinkSpec& link = axis_link(s, "ep", gpu);
      l.fwd.ep += 2 * collective_seconds(Collective::AllToAll, routed, s.ep, link);
      l.bwd.ep += 2 * collective_seconds(Collective::AllToAll, routed, s.ep, link);
      l.fwd.ep_wire = l.fwd.ep, l.bwd.ep_wire = l.bwd.ep;
    }
  }
  linear(l, x, gpu, ffn_rows, gate * ffn_width, x.h, ffn_count, !moe_layer);
  linear(l, x, gpu, ffn_rows, x.h, ffn_width, ffn_count);
  attention_core(l, m, s, x, gpu);

  // Streaming passes outside the attention core, forward bytes.
  double bytes = 0;
  if (o.eager_elementwise && !moe_layer) {
    bytes = x.tokens * eager_elementwise_bytes(m, x.e, x.h / (s.sp ? s.tp : 1), x.heads * x.d, x.kv_heads * x.d,
                                               ffn_width);
  } else {
    bytes = 2 * 2 * x.e * x.tokens_sp * x.h;                                        // two norms
    bytes += 2 * (3 * x.e + (m.dropout > 0 ? 1 : 0)) * x.tokens_sp * x.h;          // two bias + dropout + adds
    bytes += (gate + 1) * x.e * ffn_rows * ffn_count * ffn_width;                   // the activation
    if (m.position == Position::RoPE) bytes += 2 * x.e * x.tokens * (x.heads + x.kv_heads) * x.d;
  }
  l.fwd.memory += memory_seconds(bytes, gpu);
  l.bwd.memory += 2 * memory_seconds(bytes, gpu);

  context_comm(l, m, s, x, gpu);
  tensor_comm(l, s, x, gpu, o);

  Work w = l.fwd;
  w += l.bwd;
  if (s.recompute == Recompute::Full) w += l.fwd;
  if (s.recompute == Recompute::Selective && s.sac_op && !moe_layer) {
    // torchtitan's per-op checkpointing (Strategy::sac_op): the backward re-runs every second matmul of the
    // block in execution order (k, o and, with SwiGLU, w3 of q, k, v, o, w1, w3, w2; GELU: k, o, fc2) and
    // every elementwise op; the attention kernel's output is kept.
    Halves again;
    linear(again, x, gpu, x.tokens, x.kv_heads * x.d, x.h);  // k
    linear(again, x, gpu, x.tokens, x.h, x.heads * x.d);     // o
    if (m.activation == Activation::SwiGLU) linear(again, x, gpu, ffn_rows, ffn_width, x.h);  // w3
    else linear(again, x, gpu, ffn_rows, x.h, ffn_width);                                      // fc2
    w.gemm += again.fwd.gemm;
    w.memory += again.fwd.memory + memory_seconds(bytes, gpu);
  } else if (s.recompute == Recompute::Selective && !s.flash) {
    w.attention += l.core_fwd;  // core GEMMs + score passes
  }
  return w;
}

Work embedding_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu) {
  const Shape x = shape_of(m, s);
  Work w;
  // Lookup (+ positions) forward, the gradient's scatter-add backward.
  w.memory = 3 * memory_seconds(x.tokens * x.h * x.e, gpu);
  if (s.tp > 1) {
    const double X = x.tokens * x.h * x.e;
    w.tp = collective_seconds(s.sp ? Collective::ReduceScatter : Collective::AllReduce, X, s.tp, axis_link(s, "tp", gpu));
    w.tp_wire = w.tp;
  }
  return w;
}

Work output_work(const ModelSpec& m, const Strategy& s, const GpuSpec& gpu, int64_t vocab_padded) {
  const Shape x = shape_of(m, s);
  Halves l;
  const double v = static_cast<double>(vocab_padded) / s.tp;
  linear(l, x, gpu, x.tokens, v, x.h);
  // Final norm; vocab-parallel cross-entropy as Megatron-LM writes it (mpu/cross_entropy.py, gpt_model.py),
  // pass by pass over the logits: forward casts them to fp32 (read e, write 4), takes the max (read 4),
  // subtracts it (read 4, write 4), exponentiates (read 4, write 4), sums (read 4) and divides into the
  // softmax it keeps (read 4, write 4); backward scales that softmax by the loss gradient (read 4, write 4)
  // and casts it back (read 4, write e).
  const double norm = 2 * x.e * x.tokens_sp * x.h;
  l.fwd.memory += memory_seconds(norm + (x.e + 36) * x.tokens * v, gpu);
  l.bwd.memory += memory_seconds(2 * norm + (12 + x.e) * x.tokens * v, gpu);
  if (s.tp > 1) {
    const LinkSpec& link = axis_link(s, "tp", gpu);
    const double X = x.tokens * x.h * x.e;
    // SP: the final norm's output gathered, its gradient scattered; the loss's max, sum and target all-reduced.
    if (s.sp) {
      l.fwd.tp += collective_seconds(Collective::AllGather, X, s.tp, link);
      l.bwd.tp += collective_seconds(Collective::ReduceScatter, X, s.tp, link);
    } else {
      l.bwd.tp += collective_seconds(Collective::AllReduce, X, s.tp, link);
    }
    l.fwd.tp += 3 * collective_seconds(Collective::AllReduce, x.tokens * 4, s.tp, link);
    l.fwd.tp_wire = l.fwd.tp, l.bwd.tp_wire = l.bwd.tp;
  }
  Work w = l.fwd;
  w += l.bwd;
  return w;
}

double optimizer_seconds(double params, double shard, const Strategy& s, const GpuSpec& gpu) {
  // AdamW per parameter: read gradient, master, m, v; write master, m, v and the 16-bit copy (and the FP8 one).
  // Strategy::bf16_optimizer: master, m and v of 2 bytes each; fp8_params: the FP8 byte is the only copy written.
  const double states = s.bf16_optimizer ? 6 : 12;
  const double copies = s.fp8_params ? 1 : s.precision == Precision::Fp8 ? 2 + 1 : 2;
  double grad = 4, adam = 0;
  switch (s.precision) {
    case Precision::Fp32: adam = 4 + 16 + 12 - 4; break;   // the fp32 weight is the master: no copy
    case Precision::Bf16: grad = 2, adam = 2 + 2 * states + copies; break;
    case Precision::Megatron18: adam = 4 + 2 * states + copies; break;
    case Precision::Fp8: grad = 2, adam = 2 + 2 * states + copies; break;
  }
  const double grads_held = s.zero >= 2 ? shard : params;  // ZeRO-2/3 keep only their shard's gradients
  return memory_seconds(shard * adam + grads_held * 2 * grad, gpu);
}

}  // namespace meshtrain::plan
