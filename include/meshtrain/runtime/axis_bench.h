// `meshtrain bench comm --axis each`: the network tuning report (seed 003,
// "NCCL network tuning in practice"). Every group of every mesh axis with more
// than one rank is measured alone, the other ranks waiting, so one slow link
// or rank shows as one slow group rather than as a slow job. Per group and op:
//
//   latency       the shortest call over the sizes (a small message's: the
//                 fixed cost of a call);
//   half-peak     the smallest message size reaching half the peak busbw
//                 (Hockney's n_1/2: below it latency dominates, above it
//                 bandwidth);
//   peak busbw    the largest busbw over the sizes, and at which size;
//
// and each group's link class: inside a node (every rank on one node, nodes
// being the launcher's blocks of ranks_per_node ranks) or across nodes. Per
// class the spread of peak busbw over its groups; a group below half its
// class's median is flagged slow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/bench.h"

namespace meshtrain {

class DeviceMesh;

struct AxisBenchRow {
  std::string axis, op;
  std::vector<int> ranks;  // the group's world ranks
  bool inside_node = true;
  double latency_us = 0;
  int64_t half_peak_bytes = 0;
  double peak_busbw_gbs = 0;
  int64_t peak_bytes = 0;
};

// Collective over the whole mesh: every rank calls with the same options.
// The rows are complete on world rank 0 (every group's leader sends its own).
std::vector<AxisBenchRow> run_axis_bench(DeviceMesh& mesh, int ranks_per_node, const CommBenchOptions& o);

// The summary of one op's rows of one group (from run_comm_bench).
void summarize_sizes(const std::vector<CommBenchRow>& rows, AxisBenchRow& out);

std::string format_axis_table(const std::vector<AxisBenchRow>& rows);

}  // namespace meshtrain
