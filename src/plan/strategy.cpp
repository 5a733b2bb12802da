#include "meshtrain/plan/strategy.h"

#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "meshtrain/plan/partition.h"

namespace meshtrain::plan {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}
const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::Interleaved: return "interleaved";
    case Schedule::ZBH1: return "zb-h1";
  }
  return "?";
}
const char* to_string(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Megatron18: return "bf16-fp32grad";
    case Precision::Fp8: return "fp8";
  }
  return "?";
}
const char* to_string(CpImpl c) {
  switch (c) {
    case CpImpl::Ring: return "ring";
    case CpImpl::Ulysses: return "ulysses";
    case CpImpl::AllGather: return "allgather";
  }
  return "?";
}

namespace {
template <typename E>
E parse_enum(const std::string& s, std::initializer_list<E> values, const char* what) {
  std::vector<std::string> names;
  for (E v : values) {
    if (s == to_string(v)) return v;
    names.push_back(to_string(v));
  }
  throw std::invalid_argument(fmt::format("unknown {} '{}'; use {}", what, s, fmt::join(names, ", ")));
}
}  // namespace

Recompute parse_recompute(const std::string& s) {
  return parse_enum(s, {Recompute::None, Recompute::Selective, Recompute::Full}, "recomputation");
}
Schedule parse_schedule(const std::string& s) {
  return parse_enum(s, {Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZBH1}, "schedule");
}
CpImpl parse_cp_impl(const std::string& s) {
  return parse_enum(s, {CpImpl::Ring, CpImpl::Ulysses, CpImpl::AllGather}, "context-parallel attention (cp_impl)");
}
Precision parse_precision(const std::string& s) {
  return parse_enum(s, {Precision::Fp32, Precision::Bf16, Precision::Megatron18, Precision::Fp8}, "precision");
}

std::string Strategy::describe() const {
  std::string s = fmt::format("tp={} cp={} ep={} dp={} pp={}", tp, cp, ep, dp, pp);
  if (vpp > 1) s += fmt::format(" v={}", vpp);
  if (sp) s += " sp";
  s += fmt::format(" zero={}", zero);
  if (dp_shard > 0) s += fmt::format(" hsdp-shard={}", dp_shard);
  s += fmt::format(" recompute={}{} mb={} {}", to_string(recompute), sac_op && recompute == Recompute::Selective ? "-op" : "",
                   micro_batch, to_string(precision));
  if (pp > 1) s += fmt::format(" {}", to_string(schedule));
  if (offload) s += " offload";
  if (flash) s += " flash";
  if (bf16_optimizer) s += " bf16-optimizer";
  if (fp8_params) s += " fp8-params";
  return s;
}

void validate_context_parallel(const ModelSpec& m, int64_t seq, int cp, int tp, bool sp, CpImpl impl) {
  if (cp < 1) throw std::invalid_argument(fmt::format("cp = {} must be at least 1", cp));
  if (cp > 1 && seq % (2 * cp) != 0) {
    throw std::invalid_argument(fmt::format(
        "sequence {} is not divisible by 2 x cp = {}: context parallelism cuts it into 2 x cp chunks and gives rank r "
        "chunks r and 2cp-1-r (equal causal work on every rank); choose a sequence that is a multiple of {}",
        seq, 2 * cp, 2 * cp));
  }
  if (sp && tp > 1 && (seq % cp != 0 || (seq / cp) % tp != 0)) {
    throw std::invalid_argument(fmt::format("sequence {} is not divisible by cp {} x tp {}: sequence parallelism "
                                            "splits each cp rank's {} tokens over tp; choose a multiple of {}",
                                            seq, cp, tp, seq / cp, cp * tp * (cp > 1 ? 2 : 1)));
  }
  if (cp > 1 && impl == CpImpl::Ulysses && (m.heads % tp != 0 || (m.heads / tp) % cp != 0)) {
    throw std::invalid_argument(fmt::format(
        "cp_impl = ulysses gives each cp rank heads / (tp x cp) whole heads: {}'s {} heads over tp {} x cp {} do not "
        "divide; use cp_impl = \"ring\" or \"allgather\", or a cp that divides {}",
        m.name, m.heads, tp, cp, m.heads / std::max(tp, 1)));
  }
}

void validate_weight_storage(Precision p, bool bf16_optimizer, bool fp8_params) {
  if (fp8_params && p != Precision::Fp8) {
    throw std::invalid_argument(fmt::format("fp8 weights (--fp8-params) need --precision fp8, not {}: only an FP8 "
                                            "run's linears compute from FP8 weights",
                                            to_string(p)));
  }
  if (bf16_optimizer && p == Precision::Fp32) {
    throw std::invalid_argument("bf16 optimizer states (--optimizer-states bf16) with --precision fp32: an fp32 run's "
                                "weights are its master copy; use --precision bf16 or fp8, or drop --optimizer-states");
  }
}

void validate(const Strategy& s, const ModelSpec& m) {
  validate(m);
  auto fail = [](const std::string& msg) { throw std::invalid_argument(msg); };
  for (auto [name, v] : {std::pair{"tp", s.tp}, {"cp", s.cp}, {"ep", s.ep}, {"dp", s.dp}, {"pp", s.pp},
                         {"vpp", s.vpp}}) {
    if (v < 1) fail(fmt::format("{} = {} must be at least 1", name, v));
  }
  validate_weight_storage(s.precision, s.bf16_optimizer, s.fp8_params);
  const int64_t seq = s.seq > 0 ? s.seq : m.seq;
  if (m.heads % s.tp != 0) fail(fmt::format("tp {} does not divide {}'s {} heads; pick a divisor", s.tp, m.name, m.heads));
  if (m.kv_heads % s.tp != 0 && s.tp % m.kv_heads != 0) {
    fail(fmt::format("tp {} and {}'s {} kv heads: one must divide the other", s.tp, m.name, m.kv_heads));
  }
  if (m.ffn % s.tp != 0) fail(fmt::format("tp {} does not divide ffn {}", s.tp, m.ffn));
  if (m.layers < static_cast<int64_t>(s.pp) * s.vpp) {
    fail(fmt::format("{} layers are too few for pp {} x {} virtual stages", m.layers, s.pp, s.vpp));
  }
  // An uneven interleaved split is the user's list (Megatron-LM's first / last stage sizes, or its embedding and
  // loss counted as layers); without one the layers must divide.
  if (s.vpp > 1 && (s.schedule != Schedule::Interleaved || (s.pp_layers.empty() && m.layers % (s.pp * s.vpp) != 0))) {
    fail(fmt::format("virtual stages need the interleaved schedule and layers ({}) divisible by pp x v = {}, or a "
                     "list of layers per stage",
                     m.layers, s.pp * s.vpp));
  }
  if (!s.pp_layers.empty()) partition_layers(m, s.pp * s.vpp, s.pp_layers);  // throws naming the list
  validate_context_parallel(m, seq, s.cp, s.tp, s.sp, s.cp_impl);
  if (s.ep > 1 && (!m.moe() || m.experts % s.ep != 0)) {
    fail(fmt::format("ep {} needs a MoE model whose experts ({}) it divides", s.ep, m.experts));
  }
  if (s.zero < 0 || s.zero > 3) fail(fmt::format("zero stage {} must be 0, 1, 2 or 3", s.zero));
  if (s.zero >= 2 && s.pp > 1) {
    fail(fmt::format("ZeRO-{} with pipeline parallelism reduces gradients every micro-batch; use zero 1 with pp > 1",
                     s.zero));
  }
  if (s.dp_shard > 0 && (s.dp % s.dp_shard != 0 || s.zero != 3)) {
    fail(fmt::format("HSDP shard group {} must divide dp {} and use zero 3", s.dp_shard, s.dp));
  }
  if (s.offload && s.zero < 1) {
    fail("optimizer offload moves each rank's ZeRO shard of the optimizer to the host: use zero 1, 2 or 3");
  }
  if (s.sp && s.tp == 1) fail("sequence parallel needs tp > 1");
  if (s.micro_batch < 1 || s.global_batch < 1) fail("micro-batch and global batch must be positive");
  const int64_t per_step = s.micro_batch * s.dp * s.ep;
  if (s.global_batch % per_step != 0) {
    fail(fmt::format("global batch {} is not divisible by micro-batch {} x dp {} x ep {} = {}", s.global_batch,
                     s.micro_batch, s.dp, s.ep, per_step));
  }
}

}  // namespace meshtrain::plan
