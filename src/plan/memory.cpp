#include "meshtrain/plan/memory.h"

#include <algorithm>
#include <vector>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "meshtrain/plan/count.h"

namespace meshtrain::plan {
namespace {

double param_bytes(Precision p) { return p == Precision::Fp32 ? 4 : 2; }
double grad_bytes(Precision p) { return p == Precision::Fp32 || p == Precision::Megatron18 ? 4 : 2; }
// (master +) m + v: fp32 (the ZeRO paper's 12 bytes), or all three in bf16 (Strategy::bf16_optimizer).
double optimizer_bytes(Precision p, bool bf16 = false) { return p == Precision::Fp32 ? 8 : bf16 ? 6 : 12; }

// Micro-batches whose activations stage `stage` holds at its peak.
double in_flight(const Strategy& s, int stage) {
  const double m = static_cast<double>(s.microbatches());
  const double p = s.pp;
  switch (s.schedule) {
    case Schedule::GPipe: return m;
    case Schedule::OneFOneB:
    case Schedule::ZBH1: return std::min(p - stage, m);
    case Schedule::Interleaved:
      // Narayanan et al. / Korthikanti: the first stage holds p micro-batches x (1 + (p-1)/(pv)).
      return std::min(p - stage, m) * (1.0 + (p - 1) / (p * s.vpp));
  }
  return 1;
}

}  // namespace

double StageLedger::device_total() const {
  double t = 0;
  for (const auto& l : lines)
    if (!l.host) t += l.bytes;
  return t;
}

const LedgerLine& StageLedger::line(const std::string& item) const {
  for (const auto& l : lines)
    if (l.item == item) return l;
  throw std::out_of_range("ledger has no line '" + item + "'");
}

ModelStates model_state_bytes(double params, Precision p, int zero, int shard, bool fp8_transpose) {
  ModelStates m;
  m.params = params * param_bytes(p) / (zero >= 3 ? shard : 1);
  m.grads = params * grad_bytes(p) / (zero >= 2 ? shard : 1);
  m.optimizer = params * optimizer_bytes(p) / (zero >= 1 ? shard : 1);
  if (p == Precision::Fp8) m.fp8_copies = params * (fp8_transpose ? 2 : 1) / (zero >= 3 ? shard : 1);
  return m;
}

double layer_activation_bytes(const ModelSpec& m, const Strategy& s) {
  return layer_activation_bytes(m, s, m.moe() ? 0 : -1);  // layer 0 is a MoE layer when there are any
}

double layer_activation_bytes(const ModelSpec& m, const Strategy& s, int64_t layer) {
  const double sq = static_cast<double>(s.seq > 0 ? s.seq : m.seq) / s.cp;  // tokens on this rank
  const double b = static_cast<double>(s.micro_batch), h = m.hidden, t = s.tp;
  const double a = m.heads, g = m.kv_heads, d = m.head_dim(), f = m.ffn;
  const double rep = s.sp ? t : 1;  // tensors tp leaves whole, unless sequence parallel splits them
  const double sbh = sq * b * h;
  const bool drop = m.dropout > 0;
  // Bytes per activation element: Korthikanti's 2 (16-bit), 4 in fp32 runs;
  // dropout masks stay 1 byte.
  const double e = s.precision == Precision::Fp32 ? 4 : 2;
  // FP8: a linear keeps its e4m3 input for the backward's GEMMs, 1 byte, not the 16-bit one
  // (Transformer Engine's Linear, LayerNormLinear and LayerNormMLP save the quantised input;
  // meshtrain's nn::Fp8Linear likewise); the other activations stay 16-bit.
  const double in = s.precision == Precision::Fp8 ? 1 : e;
  if (s.recompute == Recompute::Full) return e * sbh / rep;  // only the layer input is kept
  if (s.recompute == Recompute::Selective && s.sac_op && !m.moe_layer(layer)) {
    // torchtitan's per-op checkpointing (Strategy::sac_op): the block input, the outputs of every other matmul
    // (q, v, w1, w2; GELU: q, v, fc1) and SDPA's output with its fp32 log-sum-exp.
    const double saved = a * d / t + g * d / t + f / t + (m.activation == Activation::SwiGLU ? h : 0);
    return e * sbh / rep + e * sq * b * saved + e * sq * b * a * d / t + 4 * a * sq * b / t;
  }
  // Attention: LN input, QKV input (2sbh each), Q, K, V, output-projection input, dropout mask.
  double attn = e * sbh / rep + in * sbh / rep + e * sq * b * a * d / t + 2 * e * sq * b * g * d / t +
                in * sq * b * a * d / t + (drop ? sbh / rep : 0);
  // Core: softmax output 2as^2b (+ dropout mask as^2b and output 2as^2b). Selective
  // recomputation drops it; flash-style kernels (and ring attention, which uses them) keep
  // only the fp32 log-sum-exp, 4asb.
  const double full_s = static_cast<double>(s.seq > 0 ? s.seq : m.seq);
  if (s.flash || (s.cp > 1 && s.cp_impl == CpImpl::Ring)) attn += 4 * a * sq * b / t;
  else if (s.recompute != Recompute::Selective) attn += (drop ? 1 + 2 * e : e) * a * sq * full_s * b / t;
  // MLP: LN input, fc1 input, f-wide intermediates (GELU: input and output;
  // SwiGLU: gate, up, product; the last of them is fc2's input), dropout mask.
  const double wide = m.activation == Activation::SwiGLU ? 3 : 2;
  if (!m.moe_layer(layer)) {
    return attn + e * sbh / rep + in * sbh / rep + ((wide - 1) * e + in) * sq * b * f / t + (drop ? sbh / rep : 0);
  }
  // A MoE layer (moe/layer.h) on this rank's rows (all of them without sequence
  // parallelism: the experts are not split by tp): the router's fp32 logits and
  // probabilities, top_k copies of each row dispatched and combined (each
  // twice: sent and received), the experts' f_e-wide intermediates, and the
  // shared experts as a dense FFN of shared x f_e.
  const double k = m.top_k, fe = static_cast<double>(m.expert_width()), E = static_cast<double>(m.experts);
  double mlp = e * sbh / rep + 2 * 4 * sq * b * E / rep + 4 * e * sq * b * k * h / rep + wide * e * sq * b * k * fe / rep;
  if (m.shared_experts > 0) mlp += e * sbh / rep + wide * e * sq * b * m.shared_experts * fe / t;
  return attn + mlp + (drop ? sbh / rep : 0);
}

int64_t fused_loss_chunk_rows(int64_t n, int64_t local_vocab, int64_t hidden) {
  const int64_t fit = kFusedLossChunkBytes / (std::max<int64_t>(1, local_vocab) * 4);
  const int64_t most = std::max<int64_t>({int64_t{1}, fit, hidden});
  const int64_t chunks = std::max<int64_t>(1, (n + most - 1) / most);
  return std::max<int64_t>(1, (n + chunks - 1) / chunks);
}

LedgerLine reserve_line(double used, const MemoryOptions& o) {
  return {"reserve", o.reserve_fixed + o.reserve_fraction * used,
          fmt::format("{} fixed (context, comm buffers) + {:.0f}% fragmentation", human_bytes(o.reserve_fixed),
                      o.reserve_fraction * 100)};
}

MemoryPlan memory_ledger(const ModelSpec& m, const Strategy& s, const MemoryOptions& o) {
  validate(s, m);
  const ParamCount c = count_params(m, 128 * s.tp);
  const double t = s.tp, sq = static_cast<double>(s.seq > 0 ? s.seq : m.seq) / s.cp;
  const double b = static_cast<double>(s.micro_batch), h = m.hidden;
  const double rep = s.sp ? t : 1;
  const Precision prec = s.precision;

  auto stage_ledger = [&](int stage) {
    StageLedger L;
    L.stage = stage;
    // The rank's layers: its stage's (the even split), or its chunks' of s.pp_layers (chunk k is stage k pp + rank).
    std::vector<int64_t> layers;
    if (s.pp_layers.empty()) {
      int64_t from = 0;
      for (int p = 0; p < stage; ++p) from += m.layers / s.pp + (p < m.layers % s.pp ? 1 : 0);
      const int64_t n = m.layers / s.pp + (stage < m.layers % s.pp ? 1 : 0);
      for (int64_t i = from; i < from + n; ++i) layers.push_back(i);
    } else {
      int64_t at = 0;
      for (size_t k = 0; k < s.pp_layers.size(); ++k) {
        if (static_cast<int>(k) % s.pp == stage) {
          for (int64_t i = at; i < at + s.pp_layers[k]; ++i) layers.push_back(i);
        }
        at += s.pp_layers[k];
      }
    }
    L.layers = static_cast<int64_t>(layers.size());
    const bool first = stage == 0, last = stage == s.pp - 1;
    // Parameters on one rank of this stage, split by how they are sharded:
    // dense ones (ZeRO over dp x cp x ep) and routed experts (over dp x cp).
    double dense = 0, expert = 0, linear = 0;  // linear: the blocks' dense linears (FP8's, below)
    for (int64_t i : layers) {
      const LayerParams& lp = c.of(m, i);
      dense += static_cast<double>(lp.tp_sharded) / t + static_cast<double>(lp.tp_replicated);
      expert += static_cast<double>(lp.expert) / s.ep;
      linear += static_cast<double>(lp.tp_sharded) / t;
    }
    if (first) dense += c.embedding / t + c.positions;
    if (last) dense += c.final_norm + (m.tied ? (s.pp > 1 ? c.embedding / t : 0) : c.head / t);
    L.params = dense + expert;
    // ZeRO shards dense parameters over dp x cp x ep, expert parameters over dp x cp.
    const int dense_group = s.shard_group() * s.cp * s.ep, expert_group = s.shard_group() * s.cp;
    ModelStates ms = model_state_bytes(dense, prec, s.zero, dense_group, s.fp8_transpose);
    ModelStates me = model_state_bytes(expert, prec, s.zero, expert_group, s.fp8_transpose);
    // FP8 copies exist for the blocks' linears and experts only: the embedding, the output layer and
    // the norms stay 16-bit (Transformer Engine's recipes, torchtitan's float8, meshtrain's fp8).
    ms.fp8_copies = model_state_bytes(linear, prec, s.zero, dense_group, s.fp8_transpose).fp8_copies;
    // The lean states of Strategy::bf16_optimizer and fp8_params: Adam's three in bf16; each linear weight held as
    // its FP8 byte alone (the 16-bit byte pair and the separate FP8 copy gone; a transposed copy, if kept, stays).
    auto lean = [&](ModelStates& st, double linear_params, int group) {
      if (s.bf16_optimizer) st.optimizer *= optimizer_bytes(prec, true) / optimizer_bytes(prec);
      if (s.fp8_params) {
        const double held = linear_params / (s.zero >= 3 ? group : 1);
        st.params -= held * (param_bytes(prec) - 1);
        st.fp8_copies = s.fp8_transpose ? held : 0;
      }
    };
    lean(ms, linear, dense_group);
    lean(me, expert, expert_group);
    const std::string shard = s.zero > 0 ? fmt::format(" (ZeRO-{} over {} ranks)", s.zero, dense_group) : "";
    L.lines.push_back({"parameters", ms.params + me.params,
                       fmt::format("{:.4g} params x {} B{}{}{}", L.params, param_bytes(prec),
                                   s.fp8_params ? fmt::format(" (the {:.4g} linear ones x 1 B: FP8 weights)",
                                                              linear + expert)
                                                : "",
                                   s.zero >= 3 ? shard : "",
                                   expert > 0 ? fmt::format(" ({:.4g} of them routed experts: {} of {} per MoE layer "
                                                            "on this rank, ep {})",
                                                            expert, m.experts / s.ep, m.experts, s.ep)
                                              : "")});
    if (s.offload && s.zero >= 2) {
      // ZeRO-Offload (DeepSpeed stage_1_and_2.py): each reduced bucket's shard goes to the host's fp32 gradient
      // partition; the device keeps the bucket being filled (reduce_bucket_size, DeepSpeed's default 5e8).
      const double shard_params = (ms.grads + me.grads) / grad_bytes(prec);
      L.lines.push_back({"gradients", shard_params * 4,
                         fmt::format("{:.4g} x 4 B (fp32, the optimizer's shard){}", L.params, shard), true});
      L.lines.push_back({"gradient bucket", std::min(L.params, 5e8) * grad_bytes(prec),
                         fmt::format("min(params, 5e8) x {} B (DeepSpeed's reduce_bucket_size)", grad_bytes(prec))});
    } else {
      L.lines.push_back({"gradients", ms.grads + me.grads,
                         fmt::format("{:.4g} x {} B{}", L.params, grad_bytes(prec), s.zero >= 2 ? shard : "")});
    }
    L.lines.push_back({"optimizer states", ms.optimizer + me.optimizer,
                       fmt::format("{:.4g} x {} B ({} {}m, v){}", L.params, optimizer_bytes(prec, s.bf16_optimizer),
                                   s.bf16_optimizer ? "bf16" : "fp32", prec == Precision::Fp32 ? "" : "master, ",
                                   s.zero >= 1 ? shard : ""),
                       s.offload});
    if (prec == Precision::Fp8 && (!s.fp8_params || s.fp8_transpose)) {
      L.lines.push_back({"fp8 weight copies", ms.fp8_copies + me.fp8_copies,
                         fmt::format("{:.4g} linear params x {} B{}", linear + expert,
                                     s.fp8_transpose && !s.fp8_params ? 2 : 1,
                                     s.fp8_params ? " (the transposed copy; the weight itself is FP8)" : "")});
    }
    // Activations.
    double per_layer = 0;  // the stage's mean
    for (int64_t i : layers) per_layer += layer_activation_bytes(m, s, i) / L.layers;
    const double flight = in_flight(s, stage);
    L.lines.push_back({"activations", per_layer * L.layers * flight,
                       fmt::format("{} per layer x {} layers x {:.3g} micro-batches in flight ({}, {} recompute{})",
                                   human_bytes(per_layer), L.layers, flight, s.pp > 1 ? to_string(s.schedule) : "no pp",
                                   to_string(s.recompute), s.sp ? ", sp" : "")});
    if (s.recompute == Recompute::Full) {
      Strategy whole = s;
      whole.recompute = Recompute::None;
      L.lines.push_back({"recompute working set", layer_activation_bytes(m, whole),
                         "one layer's activations, rebuilt during its backward"});
    }
    if (first && m.dropout > 0) {
      L.lines.push_back({"embedding dropout mask", sq * b * h / rep * flight,
                         "sbh/t per micro-batch in flight (Korthikanti)"});
    }
    if (last) {
      const double logits = 4 * sq * b * c.vocab_padded / t;
      const double e = prec == Precision::Fp32 ? 4 : 2;  // bytes per activation element
      if (s.fused_loss) {
        // One chunk's fp32 logits at a time; the forward keeps dX (the head input's shape) and the
        // head's dW (fp32, [V/t, h]) for the backward.
        const int64_t rows = static_cast<int64_t>(sq * b), local_v = c.vocab_padded / s.tp;
        const double chunk = 4.0 * static_cast<double>(fused_loss_chunk_rows(rows, local_v, m.hidden)) * local_v;
        L.lines.push_back({"logits and head input",
                           e * sq * b * h / rep + 2 * e * sq * b * h + chunk + 4 * c.vocab_padded * h / t,
                           fmt::format("final norm input 4sbh/t, head input and its dX 2 x 4sbh, a chunk of fp32 "
                                       "logits (of 4sbV/t, V = {}: at most {} or h rows), the head's dW 4Vh/t "
                                       "(fused loss)",
                                       c.vocab_padded, human_bytes(kFusedLossChunkBytes))});
      } else {
        L.lines.push_back({"logits and head input", e * sq * b * h / rep + e * sq * b * h / rep + logits,
                           fmt::format("final norm and head inputs 4sbh/t + fp32 logits 4sbV/t (V = {})",
                                       c.vocab_padded)});
      }
    }
    if (s.zero >= 3) {
      // The stage's units in forward order, whole on this rank (its tp and ep share): the embedding and
      // positions (first stage), the layers, the final norm and head (last stage; with a tied embedding the
      // head reads it, and on one stage unit 0 is gathered from the embedding to the end of backward).
      // Gathered at once: two adjacent units (the current and the prefetched one) plus a held unit 0;
      // gradients: the largest unit's, whole until reduce-scattered (parallel/data/zero.h).
      std::vector<double> units;
      if (first) units.push_back(c.embedding / t + c.positions);
      for (int64_t i : layers) units.push_back(c.of(m, i).per_rank(s.tp, s.ep));
      if (last) units.push_back(c.final_norm + (m.tied ? (first ? 0 : c.embedding / t) : c.head / t));
      const bool held = m.tied && first && last;
      const double root = held ? units.front() + units.back() : 0;
      if (held) units = std::vector<double>(units.begin() + 1, units.end() - 1);
      double pair = units.size() == 1 ? units[0] : 0, grads = root;
      for (size_t i = 0; i + 1 < units.size(); ++i) pair = std::max(pair, units[i] + units[i + 1]);
      for (double u : units) grads = std::max(grads, u);
      L.lines.push_back({"ZeRO-3 gathered units", (root + pair) * param_bytes(prec) + grads * grad_bytes(prec),
                         held ? "unit 0 (tied embedding, final norm) + two adjacent layers' full params, the largest "
                                "unit's full grads"
                              : "two adjacent units' full params (embedding, layers, head), the largest unit's full "
                                "grads"});
    }
    L.lines.push_back(reserve_line(L.device_total(), o));
    return L;
  };
  MemoryPlan plan;
  plan.first = stage_ledger(0);
  plan.last = s.pp > 1 ? stage_ledger(s.pp - 1) : plan.first;
  return plan;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string format_ledger(const StageLedger& l) {
  std::ostringstream os;
  os << fmt::format("stage {} ({} layers, {:.4g} parameters per rank)\n", l.stage, l.layers, l.params);
  for (const auto& line : l.lines) {
    os << fmt::format("  {:<26} {:>12}  {}{}\n", line.item, human_bytes(line.bytes), line.formula,
                      line.host ? "  [host memory]" : "");
  }
  os << fmt::format("  {:<26} {:>12}\n", "total on device", human_bytes(l.device_total()));
  return os.str();
}

}  // namespace meshtrain::plan
