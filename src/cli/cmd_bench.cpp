// meshtrain bench comm [--nproc N] [--mesh tp=2,...] [--axis world|tp|...] [--ops ...] [--dtypes ...]
//                      [--min 1K] [--max 64M] [--iters N] [--warmup N] [--compare] [--out FILE]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/runtime/axis_bench.h"
#include "meshtrain/comm/bench.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/comm/transport_env.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::cli {

Run add_bench(CLI::App& app) {
  struct Opts {
    int nproc = 2;
    double timeout = 300;
    int check_every = 64;
    std::string mesh, axis = "world", min = "1K", max = "64M", transport = "auto", gather = "auto", scatter = "auto",
                out;
    std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};
    std::vector<std::string> dtypes{"float"};
    CommBenchOptions bench;
  };
  auto o = std::make_shared<Opts>();
  auto bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  static std::vector<std::pair<CLI::App*, Run>> others;
  add_bench_block(bench, others);
  add_bench_train(bench, others);
  add_bench_dp(bench, others);
  add_bench_zero(bench, others);
  add_bench_pipeline(bench, others);
  add_bench_attention(bench, others);
  add_bench_rollout(bench, others);
  add_bench_context(bench, others);
  add_bench_optim(bench, others);
  add_bench_fused_ops(bench, others);
  add_bench_loss(bench, others);
  add_bench_gemm(bench, others);
  auto cmd = bench->add_subcommand("comm", "collective bandwidth, nccl-tests style");
  cmd->add_option("--nproc", o->nproc, "ranks to start when not under a launcher");
  cmd->add_option("--timeout", o->timeout, "collective timeout in seconds");
  cmd->add_option("--check-every", o->check_every, "Gloo agreement check every N-th call (0: never)")
      ->capture_default_str();
  cmd->add_option("--mesh", o->mesh, "mesh axis sizes (e.g. tp=2); dp is inferred");
  cmd->add_option("--axis", o->axis,
                  "group to measure: world, a mesh axis, or each (every group of every axis alone: latency, "
                  "half-peak size, peak busbw and link class per group; default op all_reduce)");
  cmd->add_option("--ops", o->ops, "all_reduce all_gather reduce_scatter all_to_all broadcast")->delimiter(',');
  cmd->add_option("--dtypes", o->dtypes, "float bfloat16 half double int32 int64")->delimiter(',');
  cmd->add_option("--min", o->min, "smallest size in bytes (K, M, G suffixes)");
  cmd->add_option("--max", o->max, "largest size in bytes");
  cmd->add_option("--iters", o->bench.iters, "timed calls per size");
  cmd->add_option("--warmup", o->bench.warmup, "untimed calls per size");
  cmd->add_option("--transport", o->transport, "all_reduce, broadcast and all_to_all: auto native shm");
  cmd->add_option("--gather-algo", o->gather, "auto native shm broadcast ring list");
  cmd->add_option("--scatter-algo", o->scatter, "auto native shm alltoall ring allreduce");
  cmd->add_flag("--compare", o->bench.compare, "time every algorithm and the raw backend side by side");
  cmd->add_option("--out", o->out, "also write the table to this file (rank 0)");
  return [o, cmd]() {
    for (auto& [sub, run] : others)
      if (sub->parsed()) return run();
    if (!cmd->parsed()) return 0;
    if (int rc = relaunch_if_needed(o->nproc); rc >= 0) return rc;
    o->bench.ops = o->ops;
    o->bench.dtypes = o->dtypes;
    o->bench.min_bytes = parse_bytes(o->min);
    o->bench.max_bytes = parse_bytes(o->max);
    o->bench.transport = parse_transport(o->transport);
    o->bench.gather_algo = parse_gather_algo(o->gather);
    o->bench.scatter_algo = parse_scatter_algo(o->scatter);
    for (const auto& d : o->dtypes) parse_dtype(d);  // fail before any traffic
    if (o->check_every < 0) {
      throw std::invalid_argument(fmt::format("--check-every {} must be >= 0 (0: never)", o->check_every));
    }
    auto rt = start_runtime(o->timeout, o->check_every);
    auto layout = MeshLayout::create(rt->world_size(), MeshLayout::parse(o->mesh));
    if (o->axis == "each") {
      if (cmd->count("--ops") == 0) o->bench.ops = {"all_reduce"};
      DeviceMesh mesh(*rt, layout);
      const int per_node = rt->env().local_world_size;
      const auto rows = run_axis_bench(mesh, per_node, o->bench);
      if (rt->rank() == 0) {
        const std::string table = fmt::format(
            "{}# every group of every axis measured alone ({} ranks per node; {}..{} bytes, {} timed calls per "
            "size)\n{}",
            layout.table(per_node), per_node, o->bench.min_bytes, o->bench.max_bytes, o->bench.iters,
            format_axis_table(rows));
        fmt::print("{}{}\n", table, transport_variables());
        if (!o->out.empty()) {
          std::ofstream f(o->out);
          f << table;
          if (!f) throw std::runtime_error(fmt::format("could not write {}", o->out));
        }
      }
      return 0;
    }
    std::unique_ptr<DeviceMesh> mesh;
    Comm* comm = &rt->world();
    if (o->axis != "world") {
      mesh = std::make_unique<DeviceMesh>(*rt, layout);
      comm = &mesh->axis(o->axis);
      if (rt->rank() == 0) fmt::print("{}", layout.table(rt->env().local_world_size));
    }
    auto rows = run_comm_bench(*comm, o->bench);
    int wrong = 0;
    for (const auto& r : rows) wrong += r.wrong > 0;
    if (rt->rank() == 0) {
      std::string table = format_bench_table(rows, *comm);
      fmt::print("{}{}\n", table, transport_variables());
      if (!o->out.empty()) {
        std::ofstream f(o->out);
        f << table;
        if (!f) throw std::runtime_error(fmt::format("could not write {}", o->out));
      }
    }
    return wrong ? 1 : 0;
  };
}

}  // namespace meshtrain::cli
