#include "meshtrain/plan/explain.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain::plan {
namespace {

double states_bytes(const StageLedger& l) {
  return l.line("parameters").bytes + l.line("gradients").bytes + l.line("optimizer states").bytes;
}

std::string seconds(double s) { return fmt::format("{:.3f} s", s); }

// "bytes per step, seconds on the wire, seconds exposed (link)" of one axis's traffic.
std::string traffic(const StepEstimate& e, const std::string& axis) {
  auto it = e.traffic.find(axis);
  if (it == e.traffic.end() || it->second.bytes == 0) return "none";
  const AxisTraffic& t = it->second;
  return fmt::format("{} per step, {} on the wire, {} exposed ({})", human_bytes(t.bytes), seconds(t.seconds),
                     seconds(t.exposed), t.inter_node ? "across nodes" : "inside a node");
}

// The best plan without a choice: the fastest that fits with `keep(strategy)` true, or else the leanest with it.
struct Without {
  const Candidate* fastest = nullptr;  // fits
  const Candidate* leanest = nullptr;  // does not fit
};

Without without(const std::vector<Candidate>& ranked, const std::vector<Candidate>& all,
                const std::function<bool(const Strategy&)>& keep) {
  Without w;
  for (const auto& c : ranked) {
    if (keep(c.strategy)) {
      w.fastest = &c;
      return w;
    }
  }
  for (const auto& c : all) {
    if (keep(c.strategy) && (!w.leanest || c.peak_bytes < w.leanest->peak_bytes)) w.leanest = &c;
  }
  return w;
}

// Why the choice holds, from the best plan without it: "faster: ..." (its step time and what grows),
// "needed to fit: ..." (the leanest plan without it and its memory) or "the only valid choice".
std::string verdict(const Without& w, const Candidate& best, const GpuSpec& gpu, const char* what) {
  if (w.fastest) {
    return fmt::format("faster: {} the best plan, {}, takes {} ({})", what, w.fastest->strategy.describe(),
                       seconds(w.fastest->estimate.step_s), why_slower(*w.fastest, best));
  }
  if (w.leanest) {
    return fmt::format("needed to fit: {} the leanest plan, {}, needs {} > {} of a {}", what,
                       w.leanest->strategy.describe(), human_bytes(w.leanest->peak_bytes),
                       human_bytes(gpu.memory_bytes), gpu.name);
  }
  return fmt::format("the only valid choice: no valid plan {}", what);
}

int64_t seq_of(const SearchInput& in, const Strategy& s) {
  return s.seq > 0 ? s.seq : in.seq > 0 ? in.seq : in.model.seq;
}

}  // namespace

std::string why_slower(const Candidate& runner, const Candidate& best) {
  const StepEstimate &a = runner.estimate, &b = best.estimate;
  const std::pair<const char*, double> parts[] = {{"compute", a.compute_s - b.compute_s},
                                                  {"bubble", a.bubble_s - b.bubble_s},
                                                  {"exposed communication", a.exposed_comm_s - b.exposed_comm_s},
                                                  {"optimizer", a.optimizer_s - b.optimizer_s}};
  const auto* top = &parts[0];
  for (const auto& p : parts) top = p.second > top->second ? &p : top;
  if (a.step_s <= b.step_s) return fmt::format("{:+.1f}%", 100 * (a.step_s / b.step_s - 1));
  return fmt::format("{:+.1f}%: {} {:+.3f} s", 100 * (a.step_s / b.step_s - 1), top->first, top->second);
}

std::string mesh_order(const Strategy& s, int per_node) {
  std::string out;
  const std::pair<const char*, int> order[] = {{"tp", s.tp}, {"cp", s.cp}, {"ep", s.ep}, {"dp", s.dp}, {"pp", s.pp}};
  for (const auto& [name, size] : order) {
    if (size == 1) continue;
    if (!out.empty()) out += " -> ";
    out += fmt::format("{}={} [{}]", name, size,
                       axis_crosses_nodes(s, name, per_node) ? "across nodes" : "inside a node");
  }
  return out.empty() ? "one GPU" : out;
}

void explain(const SearchInput& in, const std::vector<Candidate>& all, SearchResult& r) {
  auto& out = r.explanation;
  const double mem = in.gpu.memory_bytes;
  if (r.ranked.empty()) {
    if (r.leanest) {
      out.push_back(fmt::format(
          "Nothing fits: the leanest valid plan ({}) needs {} per GPU, more than the {} of a {}. Add GPUs, "
          "use GPUs with more memory, offload optimizer states, or shorten the sequence.",
          r.leanest->strategy.describe(), human_bytes(r.leanest->peak_bytes), human_bytes(mem), in.gpu.name));
    } else {
      out.push_back("Nothing is valid: no (tp, pp, cp, dp) divides the model and the GPU count as asked.");
    }
    return;
  }
  const Candidate& best = r.ranked.front();
  const Strategy& s = best.strategy;
  const StepEstimate& e = best.estimate;
  // The plain data-parallel baseline: every GPU holds the whole model.
  const Candidate* plain = nullptr;
  for (const auto& c : all) {
    const Strategy& t = c.strategy;
    if (t.tp == 1 && t.pp == 1 && t.cp == 1 && t.ep == 1 && t.zero == 0 && t.recompute == Recompute::None &&
        (!plain || c.peak_bytes < plain->peak_bytes)) {
      plain = &c;
    }
  }
  if (plain && plain->peak_bytes <= mem) {
    out.push_back(fmt::format("1. Does it fit? Plain DP fits ({} of {} per GPU).", human_bytes(plain->peak_bytes),
                              human_bytes(mem)));
  } else if (plain) {
    const StageLedger& p = plain->memory.peak();
    out.push_back(fmt::format("1. Does it fit? Plain DP needs {} per GPU (model states {}, activations {}) > {}.",
                              human_bytes(plain->peak_bytes), human_bytes(states_bytes(p)),
                              human_bytes(p.line("activations").bytes), human_bytes(mem)));
  }
  const StageLedger& b = best.memory.peak();
  auto why = [&](const char* what, const std::function<bool(const Strategy&)>& without_it) {
    return verdict(without(r.ranked, all, without_it), best, in.gpu, what);
  };
  if (s.zero > 0) {
    out.push_back(fmt::format("   ZeRO-{} over {} ranks: parameters + gradients + optimizer {} per GPU; {}.",
                              s.zero, s.shard_group() * s.cp * s.ep, human_bytes(states_bytes(b)),
                              why("without ZeRO", [](const Strategy& t) { return t.zero == 0; })));
  }
  if (s.tp > 1) {
    out.push_back(fmt::format("   TP={}{} inside a node: tp traffic {}; {}.", s.tp,
                              s.sp ? " + SP" : "", traffic(e, "tp"),
                              why("without TP", [](const Strategy& t) { return t.tp == 1; })));
  }
  if (s.pp > 1) {
    out.push_back(fmt::format("   PP={}{}: {} layers per stage, bubble {:.1f}% ({}), pp traffic {}; {}.",
                              s.pp, s.vpp > 1 ? fmt::format(" (interleaved, v={})", s.vpp) : "",
                              in.model.layers / s.pp, 100 * e.bubble_fraction, seconds(e.bubble_s),
                              traffic(e, "pp"),
                              why("without PP", [](const Strategy& t) { return t.pp == 1; })));
  }
  if (s.cp > 1) {
    out.push_back(fmt::format("   CP={} over the {}-token sequence: {} tokens per rank, cp traffic {}; {}.", s.cp,
                              seq_of(in, s), seq_of(in, s) / s.cp, traffic(e, "cp"),
                              why("without CP", [](const Strategy& t) { return t.cp == 1; })));
  }
  if (s.ep > 1) {
    out.push_back(fmt::format("   EP={}: ep traffic {}; {}.", s.ep, traffic(e, "ep"),
                              why("without EP", [](const Strategy& t) { return t.ep == 1; })));
  }
  if (s.recompute != Recompute::None) {
    out.push_back(fmt::format("   {} recomputation: activations {} per GPU, {:.1f}% more FLOPs; {}.",
                              s.recompute == Recompute::Full ? "Full" : "Selective",
                              human_bytes(b.line("activations").bytes),
                              100 * (e.hardware_flops / e.model_flops - 1),
                              why("without recomputation",
                                  [](const Strategy& t) { return t.recompute == Recompute::None; })));
  }
  out.push_back(fmt::format("   Micro-batch {}, {} accumulation steps per replica: activations {} per GPU.",
                            s.micro_batch, s.microbatches(), human_bytes(b.line("activations").bytes)));
  out.push_back(fmt::format("2. Fast enough? -> DP={} replicas, dp traffic {}; estimated {} per step, {:.0f} tokens/s, "
                            "MFU {:.1f}%.",
                            s.dp, traffic(e, "dp"),
                            seconds(e.step_s), e.tokens_per_s, 100 * e.mfu));
  out.push_back("Mesh order, most frequent traffic on the fastest link: " + mesh_order(s, in.gpu.per_node));
}

}  // namespace meshtrain::plan
