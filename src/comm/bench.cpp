#include "meshtrain/comm/bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>
#include <stdexcept>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/backend.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

double bus_factor(const std::string& op, int n) {
  if (op.rfind("all_reduce", 0) == 0) return 2.0 * (n - 1) / n;
  if (op.rfind("broadcast", 0) == 0) return 1.0;
  return (n - 1.0) / n;
}

// One way of running an op: `run` is timed, `check` returns #wrong after one fresh run.
struct Variant {
  std::string label;
  std::function<void()> run;
  std::function<int64_t()> check;
};

at::Tensor pattern(int64_t n, int64_t mod, int64_t offset, at::ScalarType dt) {
  return (at::arange(n, at::kLong).remainder(mod) + offset).to(dt);
}

int64_t count_wrong(const at::Tensor& got, const at::Tensor& want) {
  return got.view(-1).to(at::kDouble).ne(want.view(-1).to(at::kDouble)).sum().item<int64_t>();
}

// The transports of all_reduce and broadcast to time: the one asked for, or
// with --compare the backend's own and shared memory (where there is some).
std::vector<Transport> transports(Comm& comm, const CommBenchOptions& o) {
  if (!o.compare) return {o.transport};
  std::vector<Transport> ts{Transport::Native};
  if (comm.shm_available()) ts.push_back(Transport::Shm);
  return ts;
}

std::vector<Variant> variants_for(Comm& comm, const std::string& op, at::ScalarType dt, int64_t count,
                                  const CommBenchOptions& o) {
  const int n = comm.size(), me = comm.rank();
  std::vector<Variant> vs;
  auto opt = at::TensorOptions().dtype(dt);
  if (op == "all_reduce") {
    at::Tensor t = at::zeros({count}, opt);
    auto want = [=]() { return at::arange(count, at::kLong).remainder(3) * n + n * (n - 1) / 2; };
    // With --compare: Comm through the backend's own all-reduce (its overhead
    // over the raw call below is the wrapper's) and through shared memory.
    const std::vector<Transport> algos = transports(comm, o);
    for (auto a : algos) {
      const std::string label = a == Transport::Auto ? "all_reduce" : fmt::format("all_reduce[{}]", to_string(a));
      vs.push_back({label, [&comm, t, a]() { comm.all_reduce(t, ReduceOp::Sum, a); },
                    [&comm, t, a, count, me, dt, want]() {
                      t.copy_(pattern(count, 3, me, dt));
                      comm.all_reduce(t, ReduceOp::Sum, a);
                      return count_wrong(t, want());
                    }});
    }
    if (o.compare && comm.backend() != nullptr) {
      PGBackend* pg = comm.backend();
      vs.push_back({"all_reduce[raw]",
                    [pg, t]() {
                      std::vector<at::Tensor> v{t};
                      pg->allreduce(v)->wait();
                    },
                    [pg, t, count, me, dt, want]() -> int64_t {
                      if (dt == at::kBFloat16 && !kGlooHasBf16) return -1;  // raw Gloo cannot
                      t.copy_(pattern(count, 3, me, dt));
                      std::vector<at::Tensor> v{t};
                      pg->allreduce(v)->wait();
                      return count_wrong(t, want());
                    }});
      if (dt == at::kBFloat16 && !kGlooHasBf16 && comm.backend_kind() == BackendKind::Gloo) vs.pop_back();
    }
  } else if (op == "all_gather") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({m}, opt), out = at::zeros({m * n}, opt);
    std::vector<GatherAlgo> algos{o.gather_algo};
    if (o.compare) {
      algos = {GatherAlgo::Broadcast, GatherAlgo::Ring, GatherAlgo::List};
      if (comm.shm_available()) algos.insert(algos.begin(), GatherAlgo::Shm);
      if (comm.backend_kind() == BackendKind::Nccl) algos.insert(algos.begin(), GatherAlgo::Native);
    }
    for (auto a : algos) {
      vs.push_back({fmt::format("all_gather[{}]", to_string(a)), [&comm, in, out, a]() { comm.all_gather(out, in, a); },
                    [&comm, in, out, a, m, n, me, dt]() {
                      in.copy_(pattern(m, 5, me, dt));
                      comm.all_gather(out, in, a);
                      at::Tensor want = at::arange(m, at::kLong).remainder(5).repeat({n}) +
                                        at::arange(n, at::kLong).repeat_interleave(m);
                      return count_wrong(out, want);
                    }});
    }
  } else if (op == "reduce_scatter") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({m * n}, opt), out = at::zeros({m}, opt);
    std::vector<ScatterAlgo> algos{o.scatter_algo};
    if (o.compare) {
      algos = {ScatterAlgo::AllToAll, ScatterAlgo::Ring, ScatterAlgo::AllReduce};
      if (comm.shm_available()) algos.insert(algos.begin(), ScatterAlgo::Shm);
      if (comm.backend_kind() == BackendKind::Nccl) algos.insert(algos.begin(), ScatterAlgo::Native);
    }
    for (auto a : algos) {
      vs.push_back({fmt::format("reduce_scatter[{}]", to_string(a)),
                    [&comm, in, out, a]() { comm.reduce_scatter(out, in, ReduceOp::Sum, a); },
                    [&comm, in, out, a, m, n, me, dt]() {
                      in.copy_(pattern(m * n, 3, me, dt));
                      comm.reduce_scatter(out, in, ReduceOp::Sum, a);
                      at::Tensor want = (at::arange(m, at::kLong) + me * m).remainder(3) * n + n * (n - 1) / 2;
                      return count_wrong(out, want);
                    }});
    }
  } else if (op == "all_to_all") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({m * n}, opt), out = at::zeros({m * n}, opt);
    for (auto a : transports(comm, o)) {
      const std::string label = a == Transport::Auto ? "all_to_all" : fmt::format("all_to_all[{}]", to_string(a));
      vs.push_back({label, [&comm, in, out, a]() { comm.all_to_all(out, in, {}, {}, a); },
                    [&comm, in, out, m, n, me, dt, a]() {
                      // chunk d of rank r holds r*n + d; chunk s received here must hold s*n + me
                      in.copy_((at::arange(n, at::kLong).repeat_interleave(m) + me * n).to(dt));
                      comm.all_to_all(out, in, {}, {}, a);
                      return count_wrong(out, at::arange(n, at::kLong).repeat_interleave(m) * n + me);
                    }});
    }
  } else if (op == "broadcast") {
    at::Tensor t = at::zeros({count}, opt);
    const std::vector<Transport> algos = transports(comm, o);
    for (auto a : algos) {
      const std::string label = a == Transport::Auto ? "broadcast" : fmt::format("broadcast[{}]", to_string(a));
      vs.push_back({label, [&comm, t, a]() { comm.broadcast(t, 0, a); },
                    [&comm, t, a, count, me, dt]() {
                      t.copy_(me == 0 ? pattern(count, 7, 1, dt) : at::zeros({count}, dt));
                      comm.broadcast(t, 0, a);
                      return count_wrong(t, at::arange(count, at::kLong).remainder(7) + 1);
                    }});
    }
  } else {
    throw std::invalid_argument(
        fmt::format("unknown op '{}'; use all_reduce, all_gather, reduce_scatter, all_to_all or broadcast", op));
  }
  return vs;
}

}  // namespace

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float" || name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "half" || name == "fp16" || name == "float16") return at::kHalf;
  if (name == "double" || name == "fp64") return at::kDouble;
  if (name == "int32" || name == "int") return at::kInt;
  if (name == "int64" || name == "long") return at::kLong;
  throw std::invalid_argument(
      fmt::format("unknown dtype '{}'; use float, bfloat16, half, double, int32 or int64", name));
}

int64_t parse_bytes(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  int64_t mult = 1;
  std::string num = s;
  switch (s.back()) {
    case 'K': case 'k': mult = 1LL << 10; num.pop_back(); break;
    case 'M': case 'm': mult = 1LL << 20; num.pop_back(); break;
    case 'G': case 'g': mult = 1LL << 30; num.pop_back(); break;
    default: break;
  }
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(num, &used);
  } catch (const std::exception&) {
  }
  if (used != num.size() || v <= 0) {
    throw std::invalid_argument(fmt::format("size '{}' is not a positive byte count (e.g. 4096, 64K, 64M)", s));
  }
  return v * mult;
}

std::vector<CommBenchRow> run_comm_bench(Comm& comm, const CommBenchOptions& o) {
  if (o.min_bytes > o.max_bytes) {
    throw std::invalid_argument(fmt::format("--min {} is above --max {}", o.min_bytes, o.max_bytes));
  }
  if (o.iters < 1 || o.warmup < 0) throw std::invalid_argument("--iters must be >= 1 and --warmup >= 0");
  const int n = comm.size();
  std::vector<CommBenchRow> rows;
  for (const auto& op : o.ops) {
    for (const auto& dname : o.dtypes) {
      const at::ScalarType dt = parse_dtype(dname);
      const int64_t esize = c10::elementSize(dt);
      for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
        int64_t count = bytes / esize;
        if (op != "all_reduce" && op != "broadcast") count -= count % n;
        if (count == 0) continue;
        auto vs = variants_for(comm, op, dt, count, o);
        for (auto& v : vs)
          for (int w = 0; w < o.warmup; ++w) v.run();
        // Rounds interleave the variants so that drift hits them alike; the time
        // of a call is the slowest rank's; a variant's time is the median round.
        at::Tensor times = at::zeros({static_cast<int64_t>(vs.size()), o.iters}, at::kDouble);
        for (int it = 0; it < o.iters; ++it) {
          for (size_t j = 0; j < vs.size(); ++j) {
            const size_t k = (j + it) % vs.size();  // rotate who goes first
            comm.barrier();
            auto t0 = Clock::now();
            vs[k].run();
            times[k][it] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          }
        }
        comm.all_reduce(times, ReduceOp::Max);
        for (size_t k = 0; k < vs.size(); ++k) {
          at::Tensor wrong = at::tensor({vs[k].check()}, at::kLong);
          const bool unchecked = wrong.item<int64_t>() < 0;
          comm.all_reduce(wrong);
          CommBenchRow r;
          r.op = vs[k].label;
          r.dtype = dname;
          r.count = count;
          r.bytes = count * esize;
          r.time_us = std::get<0>(times[k].median(0)).item<double>();
          r.algbw_gbs = r.bytes / (r.time_us * 1e3);
          r.busbw_gbs = r.algbw_gbs * bus_factor(r.op, n);
          r.wrong = unchecked ? -1 : wrong.item<int64_t>();
          rows.push_back(r);
        }
      }
    }
  }
  return rows;
}

std::string format_bench_table(const std::vector<CommBenchRow>& rows, const Comm& comm) {
  std::ostringstream os;
  os << fmt::format("# group '{}' of {} ranks; time = median over rounds of the slowest rank\n", comm.name(),
                    comm.size());
  os << fmt::format("{:<26} {:>9} {:>12} {:>11} {:>12} {:>9} {:>9} {:>7}\n", "op", "dtype", "size(B)", "count",
                    "time(us)", "algbw", "busbw", "#wrong");
  for (const auto& r : rows) {
    os << fmt::format("{:<26} {:>9} {:>12} {:>11} {:>12.1f} {:>9.3f} {:>9.3f} {:>7}\n", r.op, r.dtype, r.bytes,
                      r.count, r.time_us, r.algbw_gbs, r.busbw_gbs,
                      r.wrong < 0 ? std::string("n/a") : std::to_string(r.wrong));
  }
  return os.str();
}

}  // namespace meshtrain
