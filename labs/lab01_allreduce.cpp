// LLM Lab 01: from process-group initialisation to all_reduce.
//
// Every rank joins the group (TCPStore rendezvous, then a Gloo group), says who
// it is, and contributes rank+1 to an all_reduce(sum); each must end with
// 1 + 2 + ... + W = W(W+1)/2.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include "labs/labs.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain::labs {

int lab01_allreduce(Runtime& rt) {
  const DistEnv& e = rt.env();
  if (e.rank == 0) {
    fmt::print(
        "Lab 01: init + all_reduce on {} ranks ({} per node).\n"
        "  rank        = this process's id in the whole job, 0..WORLD_SIZE-1: it decides which data shard and\n"
        "                which model shard a process owns.\n"
        "  local_rank  = its index on its own node, 0..LOCAL_WORLD_SIZE-1: it picks the device\n"
        "                (cuda:local_rank); on one node the two coincide, on node k rank = k*per_node + local_rank.\n",
        e.world_size, e.local_world_size);
  }
  rt.world().barrier();
  fmt::print("rank {} of {} | local_rank {} of {} | rendezvous {}:{} ({})\n", e.rank, e.world_size, e.local_rank,
             e.local_world_size, e.master_addr, e.master_port, e.source);

  at::Tensor t = at::full({1}, static_cast<float>(e.rank + 1));
  const float before = t.item<float>();
  rt.world().all_reduce(t);
  const float want = e.world_size * (e.world_size + 1) / 2.0f;
  const bool ok = t.item<float>() == want;
  fmt::print("rank {}: before all_reduce {:.0f}, after {:.0f} (expected {:.0f}) {}\n", e.rank, before,
             t.item<float>(), want, ok ? "ok" : "WRONG");
  rt.world().barrier();
  if (e.rank == 0) {
    fmt::print("all_reduce(sum) leaves the same total on every rank; DDP uses exactly this for gradients.\n");
  }
  return ok ? 0 : 1;
}

}  // namespace meshtrain::labs
