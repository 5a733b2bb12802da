#include "meshtrain/runtime/axis_bench.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "meshtrain/plan/memory.h"
#include "meshtrain/runtime/mesh.h"

namespace meshtrain {

void summarize_sizes(const std::vector<CommBenchRow>& rows, AxisBenchRow& out) {
  std::vector<const CommBenchRow*> mine;
  for (const auto& r : rows) {  // "all_gather[auto]": the op's one variant (no --compare)
    if (r.op == out.op || r.op.rfind(out.op + "[", 0) == 0) mine.push_back(&r);
  }
  if (mine.empty()) return;
  std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->bytes < b->bytes; });
  out.latency_us = mine.front()->time_us;
  for (const auto* r : mine) out.latency_us = std::min(out.latency_us, r->time_us);  // noise: the shortest call
  for (const auto* r : mine) {
    if (r->busbw_gbs > out.peak_busbw_gbs) {
      out.peak_busbw_gbs = r->busbw_gbs;
      out.peak_bytes = r->bytes;
    }
  }
  for (const auto* r : mine) {
    if (r->busbw_gbs >= out.peak_busbw_gbs / 2) {
      out.half_peak_bytes = r->bytes;
      break;
    }
  }
}

std::vector<AxisBenchRow> run_axis_bench(DeviceMesh& mesh, int ranks_per_node, const CommBenchOptions& o) {
  const MeshLayout& layout = mesh.layout();
  Comm& world = mesh.world();
  const int me = world.rank();
  std::vector<AxisBenchRow> rows;
  for (const auto& axis : layout.order()) {
    if (layout.size(axis) < 2) continue;
    std::set<int> leaders;  // each group by its first rank
    for (int r = 0; r < layout.world_size(); ++r) leaders.insert(layout.slice(r, {axis}).front());
    const std::vector<int> my_group = layout.slice(me, {axis});
    for (int leader : leaders) {
      const std::vector<int> ranks = layout.slice(leader, {axis});
      // The leader's 4 numbers per op reach rank 0 through one all-reduce of the world.
      at::Tensor numbers = at::zeros({static_cast<int64_t>(o.ops.size()), 4}, at::kDouble);
      if (my_group.front() == leader) {
        const auto bench = run_comm_bench(mesh.axis(axis), o);
        if (me == leader) {
          for (size_t k = 0; k < o.ops.size(); ++k) {
            AxisBenchRow r;
            r.op = o.ops[k];
            summarize_sizes(bench, r);
            const auto i = static_cast<int64_t>(k);
            numbers[i][0] = r.latency_us;
            numbers[i][1] = static_cast<double>(r.half_peak_bytes);
            numbers[i][2] = r.peak_busbw_gbs;
            numbers[i][3] = static_cast<double>(r.peak_bytes);
          }
        }
      }
      // Also the barrier that keeps the groups one at a time; over Gloo, whose waiting ranks sleep in a
      // receive (a shared-memory wait would spin beside the group measured).
      world.all_reduce(numbers, ReduceOp::Sum, Transport::Native);
      for (size_t k = 0; k < o.ops.size(); ++k) {
        const auto i = static_cast<int64_t>(k);
        AxisBenchRow r{axis, o.ops[k], ranks, true, numbers[i][0].item<double>(),
                       static_cast<int64_t>(numbers[i][1].item<double>()), numbers[i][2].item<double>(),
                       static_cast<int64_t>(numbers[i][3].item<double>())};
        for (int x : ranks) r.inside_node = r.inside_node && x / ranks_per_node == ranks.front() / ranks_per_node;
        rows.push_back(r);
      }
    }
  }
  return rows;
}

std::string format_axis_table(const std::vector<AxisBenchRow>& rows) {
  std::string out = fmt::format("{:<5} {:<15} {:<16} {:<12} {:>12} {:>12} {:>12} {:>10}\n", "axis", "op", "group ranks",
                                "link", "latency(us)", "half-peak", "peak busbw", "at size");
  for (const auto& r : rows) {
    out += fmt::format("{:<5} {:<15} {:<16} {:<12} {:>12.1f} {:>12} {:>10.3f} GB/s {:>10}\n", r.axis, r.op,
                       fmt::format("{}", fmt::join(r.ranks, ",")), r.inside_node ? "inside node" : "across nodes",
                       r.latency_us, plan::human_bytes(static_cast<double>(r.half_peak_bytes)), r.peak_busbw_gbs,
                       plan::human_bytes(static_cast<double>(r.peak_bytes)));
  }
  // Per op and link class: the spread of peak busbw, and groups below half the median.
  std::set<std::string> ops;
  for (const auto& r : rows) ops.insert(r.op);
  for (const auto& op : ops) {
    for (bool inside : {true, false}) {
      std::vector<const AxisBenchRow*> cls;
      for (const auto& r : rows) {
        if (r.op == op && r.inside_node == inside) cls.push_back(&r);
      }
      const char* name = inside ? "inside a node" : "across nodes";
      if (cls.empty()) {
        out += fmt::format("{} {}: no group of this job\n", op, name);
        continue;
      }
      std::vector<double> bw;
      for (auto* r : cls) bw.push_back(r->peak_busbw_gbs);
      std::sort(bw.begin(), bw.end());
      const double median = bw[bw.size() / 2];
      std::vector<std::string> slow;
      for (auto* r : cls) {
        if (r->peak_busbw_gbs < median / 2) slow.push_back(fmt::format("{} [{}]", r->axis, fmt::join(r->ranks, ",")));
      }
      out += fmt::format("{} {}: {} group(s), peak busbw {:.3f}..{:.3f} GB/s, median {:.3f}; slow (below half the "
                         "median): {}\n",
                         op, name, cls.size(), bw.front(), bw.back(), median,
                         slow.empty() ? "none" : fmt::format("{}", fmt::join(slow, "; ")));
    }
  }
  return out;
}

}  // namespace meshtrain
