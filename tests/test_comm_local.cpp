// A group of one rank needs no process group: every op is a local copy, the
// counters still count, and argument errors are caught before any traffic.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/runtime/axis_bench.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/comm/hang_report.h"
#include "src/comm/local_reduce.h"

namespace meshtrain {
namespace {

TEST(CommLocal, SizeOneOps) {
  Comm c("solo", 3);
  at::Tensor t = at::arange(6, at::kFloat);
  c.all_reduce(t, ReduceOp::Avg);
  EXPECT_TRUE(t.equal(at::arange(6, at::kFloat)));
  at::Tensor out = at::zeros({6});
  c.all_gather(out, t);
  EXPECT_TRUE(out.equal(t));
  c.reduce_scatter(out, t);
  EXPECT_TRUE(out.equal(t));
  c.all_to_all(out, t);
  EXPECT_TRUE(out.equal(t));
  EXPECT_EQ(c.stats().at("all_reduce").calls, 1u);
  EXPECT_EQ(c.stats().at("all_reduce").wire_bytes, 0u);
  EXPECT_EQ(c.seq(), 4u);
  EXPECT_TRUE(gather_from_region(t, c, 0).equal(t));
}

TEST(CommLocal, ArgumentErrors) {
  Comm c("solo", 0);
  at::Tensor t = at::zeros({4, 4});
  EXPECT_THROW(c.all_reduce(t.t()), std::invalid_argument);                   // not contiguous
  EXPECT_THROW(c.all_gather(at::zeros({3}), at::zeros({4})), std::invalid_argument);  // wrong size
  EXPECT_THROW(c.all_gather(at::zeros({4}, at::kDouble), at::zeros({4})), std::invalid_argument);  // dtype
  EXPECT_THROW(c.broadcast(t, 1), std::invalid_argument);                     // root outside group
  EXPECT_THROW(c.send(t, 0), std::invalid_argument);                          // to itself
}

TEST(CommLocal, AlgorithmNames) {
  EXPECT_EQ(parse_gather_algo("ring"), GatherAlgo::Ring);
  EXPECT_EQ(parse_scatter_algo("alltoall"), ScatterAlgo::AllToAll);
  EXPECT_THROW(parse_gather_algo("tree"), std::invalid_argument);
  EXPECT_EQ(parse_scatter_algo("shm"), ScatterAlgo::Shm);
  EXPECT_EQ(parse_gather_algo(to_string(GatherAlgo::Shm)), GatherAlgo::Shm);
  EXPECT_EQ(parse_transport("shm"), Transport::Shm);
  EXPECT_THROW(parse_transport("ring"), std::invalid_argument);
}

TEST(CommLocal, OnePassSumOfRows) {
  // Row counts around the four-row groups, a length that is not a whole number
  // of blocks, and the output aliasing each row in turn.
  const int64_t m = 3 * 4096 + 17;
  for (int n = 1; n <= 9; ++n) {
    at::Tensor rows = at::randn({n, m});
    at::Tensor want = rows.sum(0);
    std::vector<const float*> p(n);
    for (int r = 0; r < n; ++r) p[r] = rows[r].data_ptr<float>();
    at::Tensor out = at::empty({m});
    sum_rows(out.data_ptr<float>(), p.data(), n, m);
    EXPECT_TRUE(at::allclose(out, want, 1e-5, 1e-5)) << n << " rows";
    for (int alias = 0; alias < n; ++alias) {
      at::Tensor copy = rows.clone();
      for (int r = 0; r < n; ++r) p[r] = copy[r].data_ptr<float>();
      sum_rows(copy[alias].data_ptr<float>(), p.data(), n, m);
      EXPECT_TRUE(at::allclose(copy[alias], want, 1e-5, 1e-5)) << n << " rows, out = row " << alias;
    }
  }
}

}  // namespace
}  // namespace meshtrain

namespace {
meshtrain::FlightEntry entry(int group, uint64_t seq, meshtrain::CallKind kind, int64_t numel, double start,
                             meshtrain::CallState state) {
  meshtrain::FlightEntry e;
  e.group = group;
  e.call.seq = seq;
  e.call.kind = kind;
  e.call.dtype = 6;  // Float
  e.call.numel = numel;
  e.start = start;
  e.end = state == meshtrain::CallState::Started ? 0 : start + 1;
  e.state = state;
  return e;
}
// The report's arithmetic on given rows: the half-peak size is the smallest
// reaching half the peak busbw, the latency the shortest call, and a group
// below half its link class's median is flagged slow (one slow link or rank).
TEST(AxisBench, HalfPeakLatencyAndSlowGroups) {
  using namespace meshtrain;
  std::vector<CommBenchRow> sizes;
  for (auto [bytes, us, busbw] : std::vector<std::tuple<int64_t, double, double>>{
           {1024, 30, 0.03}, {4096, 25, 0.16}, {65536, 40, 1.6}, {262144, 80, 3.3}, {1 << 20, 300, 3.5}}) {
    sizes.push_back({"all_reduce", "float", bytes, bytes / 4, us, busbw, busbw, 0});
  }
  AxisBenchRow g{"tp", "all_reduce", {0, 1}};
  summarize_sizes(sizes, g);
  EXPECT_EQ(g.latency_us, 25);
  EXPECT_EQ(g.half_peak_bytes, 262144);  // 3.3 >= 3.5 / 2; 1.6 is not
  EXPECT_EQ(g.peak_bytes, 1 << 20);
  std::vector<AxisBenchRow> rows;
  for (int i = 0; i < 4; ++i) {
    AxisBenchRow r{"dp", "all_reduce", {i, i + 4}, true, 20, 65536, i == 2 ? 1.0 : 3.0, 1 << 20};
    rows.push_back(r);
  }
  rows.push_back({"pp", "all_reduce", {0, 8}, false, 90, 1 << 20, 0.9, 1 << 22});
  const std::string t = format_axis_table(rows);
  EXPECT_NE(t.find("all_reduce inside a node: 4 group(s), peak busbw 1.000..3.000 GB/s, median 3.000; slow (below "
                   "half the median): dp [2,6]"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("all_reduce across nodes: 1 group(s), peak busbw 0.900..0.900 GB/s, median 0.900; slow (below half "
                   "the median): none"),
            std::string::npos)
      << t;
}

}  // namespace

// The report's logic on records as three ranks would write them: rank 2
// diverged at sequence 2 of 'dp' (another size) and never reached sequence 3,
// where rank 0 failed; rank 1 got there.
TEST(HangReport, NamesTheFirstDivergenceAndTheRankBehind) {
  using meshtrain::CallKind;
  using meshtrain::CallState;
  std::vector<meshtrain::RankRecord> records(3);
  for (int r = 0; r < 3; ++r) {
    records[r].rank = r;
    records[r].groups = {{"dp", {0, 1, 2}}};
    records[r].calls.push_back(entry(0, 1, CallKind::AllReduce, 8, 10, CallState::Completed));
    records[r].calls.push_back(entry(0, 2, CallKind::AllReduce, r == 2 ? 9 : 8, 11, CallState::Completed));
  }
  records[0].calls.push_back(entry(0, 3, CallKind::Broadcast, 4, 12, CallState::Failed));
  records[1].calls.push_back(entry(0, 3, CallKind::Broadcast, 4, 12, CallState::Started));
  const auto rep = meshtrain::hang_report(records, 3, {{2, "running"}});
  EXPECT_EQ(rep.behind, std::vector<int>{2}) << rep.text;
  EXPECT_NE(rep.text.find("first divergence: group 'dp' sequence 2: rank 0 called all_reduce at sequence 2 of 8 Float "
                          "elements, rank 2 called all_reduce at sequence 2 of 9 Float elements"),
            std::string::npos)
      << rep.text;
  EXPECT_NE(rep.blame.find("rank 2 (process running; its last call on that group: sequence 2 (completed)"),
            std::string::npos)
      << rep.blame;
  EXPECT_NE(rep.blame.find("never arrived at broadcast (root -1) at sequence 3 of 4 Float elements on group 'dp' "
                           "(rank 0 failed there)"),
            std::string::npos)
      << rep.blame;
  // Nobody behind: said so.
  records[2].calls.push_back(entry(0, 3, CallKind::Broadcast, 4, 12, CallState::Started));
  EXPECT_TRUE(meshtrain::hang_report(records, 3).behind.empty());
}
