// Comm: the one door through which every collective in meshtrain passes.
//
// It wraps one c10d group (Gloo on CPU, NCCL on CUDA) and
//   - fills Gloo's gaps in libtorch 1.13 (no reduce_scatter, no _allgather_base,
//     no AVG, no bf16 collectives; PLATFORM.md) with measured emulations,
//   - counts calls and bytes per op (the planner checks its predictions on them),
//   - numbers every call (a per-group sequence number) and turns a failure or a
//     timeout into one error naming the op, the group, the sequence number and
//     the tensor's shape and dtype,
//   - checks that the ranks agree on each call (call.h: sequence number, op,
//     dtype, element count, root, reduction): over shared memory on every call
//     (each rank's description sits in its segment, compared after the
//     barrier), over Gloo every `check_every` calls (one small all-gather;
//     1 = every call, 0 = never), so ranks that disagree get one error naming
//     both calls instead of reading each other's bytes wrongly.
//
// Invariants:
//   - Every rank of a group makes the same calls in the same order (as with any
//     collective library); the sequence number is how a desync is diagnosed.
//     Collectives and point-to-point calls are numbered apart (the ranks of a
//     pipeline group send and receive different numbers of times).
//   - A tensor on the other side of the backend travels through a copy on its side:
//     CUDA tensors on a Gloo group through host memory (ranks sharing one GPU, which
//     NCCL refuses), CPU tensors on an NCCL group (counts, losses, norms) through the
//     current CUDA device. Counted and checked as the copy; the caller's tensor is
//     written when the call completes.
//   - bf16 data is moved as raw 16-bit words; bf16 sums are accumulated in fp32
//     and rounded once.
//   - A group of size 1 needs no process group: every op is a local copy or no-op.
//   - Byte counters use nccl-tests' "size": all_reduce / broadcast / send / recv
//     the tensor, all_gather the output, reduce_scatter the input, all_to_all the
//     input. `wire_bytes` is what a bandwidth-optimal algorithm sends per rank
//     (size x nccl-tests' bus factor: 2(n-1)/n all_reduce, (n-1)/n gather/scatter).
//     `moved_bytes` is what the algorithm that ran actually moved between this
//     rank and the others, counted where it moves them: each Gloo send of the
//     ring algorithms and of point-to-point calls (to that peer), each read of
//     a peer's shared-memory segment (from that peer), each all-to-all chunk
//     (to its peer). Inside Gloo's own collectives the bytes are its
//     algorithm's, by its source: the ring all-reduce sends 2(n-1)/n of the
//     (fp32-widened) buffer to the right neighbour; a broadcast's and a list
//     all-gather's split over peers is not observed (peer -1).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "meshtrain/comm/call.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/compat.h"

namespace c10d {
class Work;
}

namespace meshtrain {

class ShmGroup;

enum class ReduceOp { Sum, Avg, Max };

// Which transport carries an all_reduce or a broadcast. Auto = Shm on Gloo
// groups whose ranks share a host (CPU tensors), else Native (measured:
// docs/bench-comm.md).
//   Native: the backend's own (Gloo's ring or broadcast, NCCL).
//   Shm:    through the group's shared memory (comm/shm_group.h), within the call.
//           all_reduce: each rank copies its tensor into its segment, reduces
//           its 1/n of every segment in one pass, and copies every reduced part
//           out (two barriers); broadcast: the root copies in, the others out.
enum class Transport { Auto, Native, Shm };

// All-gather algorithms. Auto = Native on NCCL; on Gloo Shm when the group's
// ranks share a host, else Ring for 2 ranks or outputs >= 16 MiB, else
// Broadcast (measured: docs/bench-comm.md).
//   Shm:       each rank copies its input into its shared-memory segment, and
//              every rank copies all segments out (comm/shm_group.h); completes
//              within the call.
//   Broadcast: n async broadcasts, each into its slice of the output.
//   Ring:      n-1 send/recv steps around the ring (bandwidth-optimal);
//              completes within the call (not asynchronous).
//   List:      Gloo's own list all-gather (slow at size; benchmarks only).
enum class GatherAlgo { Auto, Native, Shm, Broadcast, Ring, List };

// Reduce-scatter algorithms. Auto = Native on NCCL; on Gloo Shm when the
// group's ranks share a host, else Ring for inputs >= 4 MiB, else AllToAll
// (measured: docs/bench-comm.md).
//   Shm:       each rank copies the chunks the others own into its shared-memory
//              segment; each sums its own chunk from all segments in one pass;
//              completes within the call.
//   AllToAll:  all_to_all of the chunks, then a local sum over the n received chunks.
//   Ring:      n-1 send/recv steps, partial sums travel around the ring, in
//              pieces so that adding overlaps receiving; completes within the call.
//   AllReduce: all_reduce the whole input, keep this rank's chunk.
enum class ScatterAlgo { Auto, Native, Shm, AllToAll, Ring, AllReduce };

const char* to_string(ReduceOp op);
const char* to_string(Transport t);
const char* to_string(GatherAlgo a);
const char* to_string(ScatterAlgo a);
Transport parse_transport(const std::string& s);
GatherAlgo parse_gather_algo(const std::string& s);
ScatterAlgo parse_scatter_algo(const std::string& s);

struct OpStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;        // nccl-tests "size" (see above)
  uint64_t wire_bytes = 0;   // bytes a bandwidth-optimal algorithm sends per rank
  uint64_t moved_bytes = 0;  // bytes the algorithm that ran moved (see above)
  std::map<int, uint64_t> peers;  // moved_bytes by peer (group index; -1: inside Gloo, not observed)
};

// A collective failed or timed out. The message names op, group, sequence and shape.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective in flight. wait() completes it, including local post-processing
// (division for AVG, the local sum of a reduce-scatter, copying back bf16).
class CommWork {
 public:
  CommWork();  // out of line: c10d::Work is incomplete here
  CommWork(CommWork&&) noexcept;
  CommWork& operator=(CommWork&&) noexcept;
  ~CommWork();  // waits if the caller did not (errors are then only logged)
  void wait();
  bool done() const { return done_; }

 private:
  friend class Comm;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::function<void()> finish_;
  // Records the call's end in the flight recorder (once).
  void settle(CallState state);
  // The call failed with `why`: recorded, and this rank's flight record dumped.
  void fail(const std::string& why);
  std::string what_;  // "all_reduce on group 'tp' ... seq 7 shape [4, 8] float"
  double* blocked_ = nullptr;  // its group's blocked seconds, which wait() adds to
  bool done_ = true;
  uint64_t flight_ = 0;  // its flight recorder entry (0: none)
};

class Comm {
 public:
  // `pg` may be null when `ranks` has one element. `ranks` are global ranks in
  // group order; `index` is this process's position in it.
  Comm(c10::intrusive_ptr<PGBackend> pg, BackendKind kind, std::string name, std::vector<int> ranks,
       int index);
  // A group holding only `global_rank`: no process group behind it.
  Comm(std::string name, int global_rank, BackendKind kind = BackendKind::Gloo);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return index_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }
  BackendKind backend_kind() const { return kind_; }
  uint64_t seq() const { return seq_; }  // collectives so far
  // The agreement check over Gloo runs on every n-th collective (0: never).
  void set_check_every(int n) { check_every_ = n; }
  PGBackend* backend() const { return pg_.get(); }  // raw group, for baselines only
  // How long a shared-memory barrier waits for the other ranks (the process
  // group has its own, set when it is made).
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // Whether the Shm algorithms can run on this group, deciding it (collectively:
  // every rank must call this at the same point) on the first call.
  bool shm_available();

  // In place on `t`.
  CommWork all_reduce_async(const at::Tensor& t, ReduceOp op = ReduceOp::Sum, Transport algo = Transport::Auto);
  void all_reduce(const at::Tensor& t, ReduceOp op = ReduceOp::Sum, Transport algo = Transport::Auto) {
    all_reduce_async(t, op, algo).wait();
  }

  // out holds size() * in.numel() elements; rank r's `in` lands at [r*n, (r+1)*n).
  CommWork all_gather_async(const at::Tensor& out, const at::Tensor& in, GatherAlgo algo = GatherAlgo::Auto);
  void all_gather(const at::Tensor& out, const at::Tensor& in, GatherAlgo algo = GatherAlgo::Auto) {
    all_gather_async(out, in, algo).wait();
  }

  // in holds size() * out.numel() elements; out = reduction over ranks of chunk rank().
  CommWork reduce_scatter_async(const at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum,
                                ScatterAlgo algo = ScatterAlgo::Auto);
  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum,
                      ScatterAlgo algo = ScatterAlgo::Auto) {
    reduce_scatter_async(out, in, op, algo).wait();
  }

  // root is a group rank (0..size()-1).
  CommWork broadcast_async(const at::Tensor& t, int root, Transport algo = Transport::Auto);
  void broadcast(const at::Tensor& t, int root, Transport algo = Transport::Auto) {
    broadcast_async(t, root, algo).wait();
  }

  // Splits count rows of dim 0; empty = equal splits. out_splits[r] rows come
  // from rank r, in_splits[r] rows go to rank r. Auto: over shared memory on
  // one host (CPU tensors of a Gloo group), else the backend's.
  void all_to_all(const at::Tensor& out, const at::Tensor& in, std::vector<int64_t> out_splits = {},
                  std::vector<int64_t> in_splits = {}, Transport algo = Transport::Auto);

  // Point-to-point; peers are group ranks.
  CommWork isend(const at::Tensor& t, int dst, int tag = 0);
  CommWork irecv(const at::Tensor& t, int src, int tag = 0);
  void send(const at::Tensor& t, int dst, int tag = 0) { isend(t, dst, tag).wait(); }
  void recv(const at::Tensor& t, int src, int tag = 0) { irecv(t, src, tag).wait(); }

  void barrier();

  // Whether this group's shared-memory all_to_all reads each chunk straight
  // from its sender's memory (one copy; known after the first one ran).
  bool all_to_all_single_copy() const { return cma_ == 1; }

  const std::map<std::string, OpStats>& stats() const { return stats_; }
  void reset_stats() { stats_.clear(); }

  // Seconds the calling thread has spent inside this group's calls: issuing them
  // and in CommWork::wait (an op built of others counts once). On CPU (Gloo, shared
  // memory) a call completes on host threads, so this is the communication the
  // work did not overlap: its exposed time (per step: the difference of two reads).
  // With NCCL the host returns before the device finishes: there it is a lower bound.
  double blocked_seconds() const { return blocked_s_; }

 private:
  // The device `t` travels through on this group (see the invariants), or nullopt.
  std::optional<c10::Device> staging(const at::Tensor& t) const;
  // `w`, with `then` run once it completed (now, when it already has).
  static CommWork followed(CommWork w, std::function<void()> then);
  std::string describe(const char* op, const at::Tensor& t) const;
  void count(const char* op, const at::Tensor& sized, double bus_factor);
  // `bytes` of `op` moved between this rank and `peer` (OpStats::moved_bytes).
  void moved(const char* op, int peer, int64_t bytes);
  // Gloo's ring all-reduce of `t` (the buffer handed to it): 2(n-1)/n of it to the right neighbour.
  void moved_by_gloo_ring(const char* op, const at::Tensor& t);
  // Numbers the call `kind` on tensor `t` and makes it the current call.
  void begin(CallKind kind, const at::Tensor& t, int root = -1, ReduceOp* reduce = nullptr);
  // Over Gloo, every check_every-th collective: the ranks exchange their
  // current call and throw the same CommError on every rank when they differ.
  void agree_native(CommWork& w);
  // Runs a call's synchronous algorithm `f`; the call completes, or fails
  // (recorded, the flight record dumped) and rethrows.
  void run_sync(CommWork& w, const std::function<void()>& f);
  CommWork make_work(const char* op, const at::Tensor& t) const;
  void ring_all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& what);
  void ring_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, const std::string& what);
  bool native_bf16() const;
  // The group's shared memory with room for `bytes` per rank, or null when the
  // group has none (collective when it is first made or must grow).
  ShmGroup* shm(int64_t bytes);
  ShmGroup& shm_or_throw(const at::Tensor& t, int64_t bytes, const char* op);
  // Auto -> Shm where this group has shared memory for `t`, else Native.
  Transport resolve(Transport chosen, const at::Tensor& t);
  void shm_all_reduce(const at::Tensor& t, ReduceOp op, const std::string& what);
  void shm_broadcast(const at::Tensor& t, int root, const std::string& what);
  void shm_all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& what);
  void shm_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, const std::string& what);
  // Splits in bytes: chunk r of `in` goes to rank r, chunk r of `out` comes from it.
  void shm_all_to_all(uint8_t* out, const std::vector<int64_t>& out_bytes, const uint8_t* in,
                      const std::vector<int64_t>& in_bytes, const std::string& what);
  // Single copy (cross-memory attach, process_vm_readv): whether every rank of
  // the group can read the others' memory (probed once, collectively), and the
  // all-to-all that reads each chunk straight from its sender's input.
  bool cma_ready(ShmGroup& g, const std::string& what);
  void cma_all_to_all(ShmGroup& g, uint8_t* out, const std::vector<int64_t>& out_off, const uint8_t* in,
                      const std::vector<int64_t>& header, const std::string& what);
  // Scratch memory reused across calls (PLATFORM.md: fresh large buffers cost
  // page faults every step). Only synchronous algorithms use it.
  at::Tensor workspace(int64_t numel, at::ScalarType dtype);

  c10::intrusive_ptr<PGBackend> pg_;
  BackendKind kind_;
  std::string name_;
  std::vector<int> ranks_;
  int index_;
  uint64_t seq_ = 0;      // collectives
  uint64_t p2p_seq_ = 0;  // sends and receives
  CallDesc call_;         // the call in progress (or the last)
  int cma_ = -1;          // cma_ready(): -1 not probed yet, 0 no, 1 yes
  int check_every_ = 64;
  int flight_group_ = -1;  // this group in the flight recorder
  std::map<std::string, OpStats> stats_;
  at::Tensor workspace_;  // bytes
  std::chrono::milliseconds timeout_{300000};
  std::unique_ptr<ShmGroup> shm_;
  bool shm_off_ = false;
  mutable double blocked_s_ = 0;  // blocked_seconds()  // decided by every rank together: no shared memory
  std::string shm_why_;   // why not
};

}  // namespace meshtrain
