// `meshtrain bench comm`: collective benchmark in the manner of nccl-tests.
//
// For each op x dtype x size (powers of two): time per call (the slowest rank's
// mean over `iters` after `warmup`), algbw = size / time, busbw = algbw x the
// nccl-tests bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter,
// all_to_all (n-1)/n; broadcast 1), and #wrong elements of a checked call whose
// inputs are small integers (exact in every dtype).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/comm/comm.h"

namespace meshtrain {

struct CommBenchOptions {
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};
  std::vector<std::string> dtypes{"float"};
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 1 << 26;
  int warmup = 2;
  int iters = 5;
  Transport transport = Transport::Auto;  // of all_reduce, broadcast and all_to_all
  GatherAlgo gather_algo = GatherAlgo::Auto;
  ScatterAlgo scatter_algo = ScatterAlgo::Auto;
  // Also time every algorithm of all_reduce, all_gather and reduce_scatter,
  // and the raw backend's all_reduce, as rows beside Comm's.
  bool compare = false;
};

struct CommBenchRow {
  std::string op;     // "all_reduce", "all_gather[ring]", "all_reduce[raw gloo]", ...
  std::string dtype;
  int64_t bytes = 0;  // nccl-tests size
  int64_t count = 0;  // elements in `bytes`
  double time_us = 0;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  int64_t wrong = 0;  // -1: not checked
};

at::ScalarType parse_dtype(const std::string& name);
int64_t parse_bytes(const std::string& s);  // "64M", "1K", "4096"

// Collective over `comm`: every rank of it must call with the same options.
std::vector<CommBenchRow> run_comm_bench(Comm& comm, const CommBenchOptions& opts);
std::string format_bench_table(const std::vector<CommBenchRow>& rows, const Comm& comm);

}  // namespace meshtrain
