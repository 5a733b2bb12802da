#include "meshtrain/comm/comm.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "comm/backend.h"
#include "comm/blocked_timer.h"
#include "comm/checks.h"
#include "comm/local_reduce.h"
#include "comm/shm_group.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/platform/crash_point.h"

namespace meshtrain {
namespace {

// Gloo: where the ring algorithms overtake the single-op ones (measured on 2 and
// 4 loopback ranks, docs/bench-comm.md). Below them latency dominates, and one
// broadcast per rank or one all_to_all beats n-1 sequential ring steps.
constexpr int64_t kRingGatherMinBytes = int64_t{16} << 20;  // output; always ring on 2 ranks
constexpr int64_t kRingScatterMinBytes = int64_t{4} << 20;  // input
// The shared-memory segment an all-to-all asks for: the same on every rank (its
// ranks send different amounts, and growing a segment is collective); larger
// exchanges run in rounds of it.
constexpr int64_t kAllToAllShmBytes = int64_t{8} << 20;


bool is_floating(const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); }

void check_same_dtype(const char* op, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type()) {
    throw std::invalid_argument(fmt::format("{}: output dtype {} differs from input dtype {}", op,
                                            c10::toString(a.scalar_type()), c10::toString(b.scalar_type())));
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  // Avg is done as Sum and a division: Gloo in 1.13 has no AVG.
  return op == ReduceOp::Max ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

std::vector<at::Tensor> unbind_rows(const at::Tensor& chunks) {
  std::vector<at::Tensor> rows;
  for (int64_t k = 0; k < chunks.size(0); ++k) rows.push_back(chunks[k]);
  return rows;
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* to_string(Transport t) {
  switch (t) {
    case Transport::Auto: return "auto";
    case Transport::Native: return "native";
    case Transport::Shm: return "shm";
  }
  return "?";
}

const char* to_string(GatherAlgo a) {
  switch (a) {
    case GatherAlgo::Auto: return "auto";
    case GatherAlgo::Native: return "native";
    case GatherAlgo::Shm: return "shm";
    case GatherAlgo::Broadcast: return "broadcast";
    case GatherAlgo::Ring: return "ring";
    case GatherAlgo::List: return "list";
  }
  return "?";
}

const char* to_string(ScatterAlgo a) {
  switch (a) {
    case ScatterAlgo::Auto: return "auto";
    case ScatterAlgo::Native: return "native";
    case ScatterAlgo::Shm: return "shm";
    case ScatterAlgo::AllToAll: return "alltoall";
    case ScatterAlgo::Ring: return "ring";
    case ScatterAlgo::AllReduce: return "allreduce";
  }
  return "?";
}

Transport parse_transport(const std::string& s) {
  for (auto t : {Transport::Auto, Transport::Native, Transport::Shm})
    if (s == to_string(t)) return t;
  throw std::invalid_argument(fmt::format("unknown transport '{}'; use auto, native or shm", s));
}

GatherAlgo parse_gather_algo(const std::string& s) {
  for (auto a : {GatherAlgo::Auto, GatherAlgo::Native, GatherAlgo::Shm, GatherAlgo::Broadcast, GatherAlgo::Ring,
                 GatherAlgo::List})
    if (s == to_string(a)) return a;
  throw std::invalid_argument(
      fmt::format("unknown all_gather algorithm '{}'; use auto, native, shm, broadcast, ring or list", s));
}

ScatterAlgo parse_scatter_algo(const std::string& s) {
  for (auto a : {ScatterAlgo::Auto, ScatterAlgo::Native, ScatterAlgo::Shm, ScatterAlgo::AllToAll, ScatterAlgo::Ring,
                 ScatterAlgo::AllReduce})
    if (s == to_string(a)) return a;
  throw std::invalid_argument(fmt::format(
      "unknown reduce_scatter algorithm '{}'; use auto, native, shm, alltoall, ring or allreduce", s));
}

// -------------------------------------------------------------------- Comm

Comm::Comm(c10::intrusive_ptr<PGBackend> pg, BackendKind kind, std::string name, std::vector<int> ranks,
           int index)
    : pg_(std::move(pg)), kind_(kind), name_(std::move(name)), ranks_(std::move(ranks)), index_(index) {
  if (ranks_.empty() || index_ < 0 || index_ >= size()) {
    throw std::invalid_argument(fmt::format("group '{}': index {} outside its {} ranks", name_, index_, ranks_.size()));
  }
  if (!pg_ && size() > 1) {
    throw std::invalid_argument(fmt::format("group '{}' of {} ranks needs a process group", name_, size()));
  }
  if (size() > 1) flight_group_ = FlightRecorder::instance().group(name_, ranks_);
}

Comm::Comm(std::string name, int global_rank, BackendKind kind)
    : Comm(c10::intrusive_ptr<PGBackend>(), kind, std::move(name), {global_rank}, 0) {}

Comm::~Comm() = default;

at::Tensor Comm::workspace(int64_t numel, at::ScalarType dtype) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  if (!workspace_.defined() || workspace_.numel() < bytes) workspace_ = at::empty({bytes}, at::kByte);
  return workspace_.narrow(0, 0, bytes).view(dtype);
}

bool Comm::native_bf16() const { return kind_ == BackendKind::Nccl || kGlooHasBf16; }

std::string Comm::describe(const char* op, const at::Tensor& t) const {
  const bool p2p = call_.kind == CallKind::Send || call_.kind == CallKind::Recv;
  return fmt::format("{} on group '{}' (global ranks [{}], this is group rank {} of {}; timeout {:g} s) at "
                     "{}sequence {}, tensor shape [{}] dtype {}",
                     op, name_, fmt::join(ranks_, ", "), index_, size(), timeout_.count() / 1000.0,
                     p2p ? "point-to-point " : "", call_.seq, fmt::join(t.sizes(), ", "),
                     c10::toString(t.scalar_type()));
}


CommWork Comm::all_reduce_async(const at::Tensor& t, ReduceOp op, Transport algo) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("all_reduce", t);
  if (const auto d = staging(t)) {
    at::Tensor s = t.to(*d);
    return followed(all_reduce_async(s, op, algo), [t, s]() { t.copy_(s); });
  }
  if (op == ReduceOp::Avg && !is_floating(t)) {
    throw std::invalid_argument(fmt::format("all_reduce avg needs a floating tensor, got {}; use sum",
                                            c10::toString(t.scalar_type())));
  }
  const int n = size();
  count("all_reduce", t, 2.0 * (n - 1) / n);
  begin(CallKind::AllReduce, t, -1, &op);
  CommWork w = make_work("all_reduce", t);
  if (n == 1) { w.done_ = true; return w; }
  if (resolve(algo, t) == Transport::Shm) {
    run_sync(w, [&] { shm_all_reduce(t, op, w.what_); });
    return w;
  }
  agree_native(w);
  at::Tensor buf = t;
  if (!native_bf16() && t.scalar_type() == at::kBFloat16) buf = t.to(at::kFloat);  // sum in fp32
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  w.works_.push_back(pg_->allreduce(v, opts));
  moved_by_gloo_ring("all_reduce", buf);
  w.finish_ = [t, buf, op, n]() {
    if (op == ReduceOp::Avg) buf.div_(n);
    if (!buf.is_same(t)) t.copy_(buf);
  };
  return w;
}

CommWork Comm::all_gather_async(const at::Tensor& out, const at::Tensor& in, GatherAlgo algo) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("all_gather", out);
  check_contiguous("all_gather", in);
  check_same_dtype("all_gather", out, in);
  if (const auto d = staging(in)) {
    at::Tensor so = at::empty(out.sizes(), out.options().device(*d));
    return followed(all_gather_async(so, in.to(*d), algo), [out, so]() { out.copy_(so); });
  }
  const int n = size();
  const int64_t m = in.numel();
  if (out.numel() != n * m) {
    throw std::invalid_argument(fmt::format("all_gather on group '{}': output has {} elements, needs {} x {} = {}",
                                            name_, out.numel(), n, m, n * m));
  }
  count("all_gather", out, (n - 1.0) / n);
  begin(CallKind::AllGather, in);
  CommWork w = make_work("all_gather", in);
  if (n == 1) {
    out.view(-1).copy_(in.view(-1));
    { w.done_ = true; return w; }
  }
  const int64_t in_bytes = in.numel() * in.element_size();
  if (algo == GatherAlgo::Auto) {
    const bool big = out.numel() * out.element_size() >= kRingGatherMinBytes;
    algo = kind_ == BackendKind::Nccl       ? GatherAlgo::Native
           : in.is_cpu() && shm(in_bytes)  ? GatherAlgo::Shm
           : (n == 2 || big)               ? GatherAlgo::Ring
                                           : GatherAlgo::Broadcast;
  }
  at::Tensor o = as_transport(out, native_bf16()).view(-1);
  at::Tensor i = as_transport(in, native_bf16()).view(-1);
  if (algo != GatherAlgo::Shm) agree_native(w);
  switch (algo) {
    case GatherAlgo::Native:
      w.works_.push_back(backend_all_gather_base(*pg_, o, i));
      moved("all_gather", -1, (n - 1) * i.numel() * i.element_size());  // NCCL's ring
      break;
    case GatherAlgo::Shm:
      run_sync(w, [&] { shm_all_gather(o, i, w.what_); });
      break;
    case GatherAlgo::Broadcast:
      // Each rank's slice of the output is broadcast from its owner (PLATFORM.md:
      // 2x faster than Gloo's list all-gather at 64 MiB).
      for (int r = 0; r < n; ++r) {
        at::Tensor slice = o.narrow(0, r * m, m);
        if (r == index_) slice.copy_(i);
        std::vector<at::Tensor> v{slice};
        c10d::BroadcastOptions opts;
        opts.rootRank = r;
        w.works_.push_back(pg_->broadcast(v, opts));
      }
      moved("all_gather", -1, (n - 1) * i.numel() * i.element_size());  // received, over Gloo's broadcasts
      break;
    case GatherAlgo::Ring:
      run_sync(w, [&] { ring_all_gather(o, i, w.what_); });
      break;
    case GatherAlgo::List: {
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int r = 0; r < n; ++r) outs[0].push_back(o.narrow(0, r * m, m));
      std::vector<at::Tensor> ins{i};
      w.works_.push_back(pg_->allgather(outs, ins));
      moved("all_gather", -1, (n - 1) * i.numel() * i.element_size());  // received, inside Gloo
      break;
    }
    case GatherAlgo::Auto:
      break;
  }
  return w;
}

// Ring all-gather: at step s this rank forwards chunk (me - s) to its right
// neighbour and receives chunk (me - s - 1) from its left one; after n-1 steps
// every rank holds every chunk. Each rank sends (n-1)/n of the output: optimal.
void Comm::ring_all_gather(const at::Tensor& o, const at::Tensor& i, const std::string& what) {
  const int n = size(), me = index_;
  const int64_t m = i.numel();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  o.narrow(0, me * m, m).copy_(i);
  try {
    for (int s = 0; s < n - 1; ++s) {
      std::vector<at::Tensor> sv{o.narrow(0, ((me - s + n) % n) * m, m)};
      std::vector<at::Tensor> rv{o.narrow(0, ((me - s - 1 + 2 * n) % n) * m, m)};
      auto sw = pg_->send(sv, right, kRingTagBase + s);
      moved("all_gather", right, m * i.element_size());
      auto rw = pg_->recv(rv, left, kRingTagBase + s);
      sw->wait();
      rw->wait();
    }
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} (ring) did not complete: {}", what, e.what()));
  }
}

CommWork Comm::reduce_scatter_async(const at::Tensor& out, const at::Tensor& in, ReduceOp op, ScatterAlgo algo) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("reduce_scatter", out);
  check_contiguous("reduce_scatter", in);
  check_same_dtype("reduce_scatter", out, in);
  if (const auto d = staging(in)) {
    at::Tensor so = at::empty(out.sizes(), out.options().device(*d));
    return followed(reduce_scatter_async(so, in.to(*d), op, algo), [out, so]() { out.copy_(so); });
  }
  const int n = size();
  const int64_t m = out.numel();
  if (in.numel() != n * m) {
    throw std::invalid_argument(fmt::format(
        "reduce_scatter on group '{}': input has {} elements, needs {} x {} = {}", name_, in.numel(), n, m, n * m));
  }
  if (op == ReduceOp::Avg && !is_floating(in)) {
    throw std::invalid_argument("reduce_scatter avg needs a floating tensor; use sum");
  }
  count("reduce_scatter", in, (n - 1.0) / n);
  begin(CallKind::ReduceScatter, in, -1, &op);
  CommWork w = make_work("reduce_scatter", in);
  if (n == 1) {
    out.view(-1).copy_(in.view(-1));
    { w.done_ = true; return w; }
  }
  if (algo == ScatterAlgo::Auto) {
    const int64_t bytes = in.numel() * in.element_size();
    algo = kind_ == BackendKind::Nccl       ? ScatterAlgo::Native
           : in.is_cpu() && shm(bytes)      ? ScatterAlgo::Shm
           : bytes >= kRingScatterMinBytes  ? ScatterAlgo::Ring
                                            : ScatterAlgo::AllToAll;
  }
  if (algo != ScatterAlgo::Shm) agree_native(w);
  switch (algo) {
    case ScatterAlgo::Native: {
      at::Tensor o = out.view(-1), i = in.view(-1);
      w.works_.push_back(backend_reduce_scatter_base(*pg_, o, i, op == ReduceOp::Max));
      moved("reduce_scatter", -1, (n - 1) * o.numel() * o.element_size());  // NCCL's ring
      if (op == ReduceOp::Avg) w.finish_ = [o, n]() { o.div_(n); };
      break;
    }
    case ScatterAlgo::AllToAll: {
      // Chunk r of every rank's input goes to rank r; each rank then sums its n
      // received chunks locally (in fp32 for 16-bit types).
      at::Tensor recv = at::empty_like(in).view(-1);
      at::Tensor ro = as_transport(recv, native_bf16()), ri = as_transport(in, native_bf16()).view(-1);
      std::vector<int64_t> splits;  // empty = equal
      w.works_.push_back(pg_->alltoall_base(ro, ri, splits, splits));
      for (int r = 0; r < n; ++r) {
        if (r != index_) moved("reduce_scatter", r, m * ri.element_size());
      }
      w.finish_ = [out, recv, op, n, m]() { reduce_rows(out, unbind_rows(recv.view({n, m})), op); };
      break;
    }
    case ScatterAlgo::Shm:
      run_sync(w, [&] { shm_reduce_scatter(out, in, op, w.what_); });
      break;
    case ScatterAlgo::Ring:
      run_sync(w, [&] { ring_reduce_scatter(out, in, op, w.what_); });
      break;
    case ScatterAlgo::AllReduce: {
      at::Tensor full = in.to(in.scalar_type() == at::kBFloat16 ? at::kFloat : in.scalar_type(), false, true);
      std::vector<at::Tensor> v{full};
      c10d::AllreduceOptions opts;
      opts.reduceOp = to_c10d(op);
      w.works_.push_back(pg_->allreduce(v, opts));
      moved_by_gloo_ring("reduce_scatter", full);
      const int me = index_;
      w.finish_ = [out, full, op, n, m, me]() {
        at::Tensor mine = full.view(-1).narrow(0, me * m, m);
        if (op == ReduceOp::Avg) mine.div_(n);
        out.view(-1).copy_(mine);
      };
      break;
    }
    case ScatterAlgo::Auto:
      break;
  }
  return w;
}

// Ring reduce-scatter: at step s this rank sends its partial sum of chunk
// (me - s - 1) to the right and receives the partial of chunk (me - s - 2) from
// the left, adding its own contribution to it. After n-1 steps the partial of
// chunk `me` holds every rank's contribution. Each chunk moves in up to
// kRingPieces pieces, so that adding piece k overlaps the transfer of piece
// k+1, and piece k is forwarded as soon as it is added. Two buffers alternate
// (received in step s = sent in step s+1); the input is never written or copied
// whole. Partial sums of 16-bit types travel in fp32.
void Comm::ring_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, const std::string& what) {
  const int n = size(), me = index_;
  const int64_t m = out.numel();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  const bool widen = is_16bit(in);
  const auto acc_type = widen ? at::kFloat : in.scalar_type();
  const int64_t piece_bytes = int64_t{1} << 20;
  const int pieces = static_cast<int>(std::clamp<int64_t>(m * c10::elementSize(acc_type) / piece_bytes, 1, 8));
  auto chunk = [&](int c) { return in.view({n, m})[((c % n) + n) % n]; };
  auto piece = [&](const at::Tensor& t, int k) {
    const int64_t lo = m * k / pieces, hi = m * (k + 1) / pieces;
    return t.narrow(0, lo, hi - lo);
  };
  auto tag = [&](int s, int k) { return kRingTagBase + s * pieces + k; };
  at::Tensor both = workspace(2 * m, acc_type);
  at::Tensor bufs[2] = {both.narrow(0, 0, m), both.narrow(0, m, m)};
  std::vector<c10::intrusive_ptr<c10d::Work>> sends(pieces), recvs(pieces);
  auto post_send = [&](const at::Tensor& t, int s, int k) {
    std::vector<at::Tensor> v{piece(t, k)};
    sends[k] = pg_->send(v, right, tag(s, k));
    moved("reduce_scatter", right, v[0].numel() * v[0].element_size());
  };
  auto post_recv = [&](const at::Tensor& t, int s, int k) {
    std::vector<at::Tensor> v{piece(t, k)};
    recvs[k] = pg_->recv(v, left, tag(s, k));
  };
  const at::Tensor first = widen ? chunk(me - 1).to(at::kFloat) : chunk(me - 1);
  at::Tensor o = out.view(-1);
  try {
    for (int k = 0; k < pieces; ++k) post_recv(bufs[0], 0, k);
    for (int k = 0; k < pieces; ++k) post_send(first, 0, k);
    for (int s = 0; s < n - 1; ++s) {
      at::Tensor recv_buf = bufs[s % 2], next_buf = bufs[(s + 1) % 2];
      const bool last = s == n - 2;
      const at::Tensor mine = chunk(me - s - 2);
      for (int k = 0; k < pieces; ++k) {
        recvs[k]->wait();
        at::Tensor r = piece(recv_buf, k);
        if (last && !widen && op != ReduceOp::Max) {
          at::Tensor ok = piece(o, k);
          at::add_out(ok, r, piece(mine, k));
          if (op == ReduceOp::Avg) ok.div_(n);
          continue;
        }
        combine(r, piece(mine, k), op);
        if (last) {
          if (op == ReduceOp::Avg) r.div_(n);
          piece(o, k).copy_(r);
          continue;
        }
        sends[k]->wait();  // step s sent from next_buf's piece k: free it before receiving into it
        post_recv(next_buf, s + 1, k);
        post_send(recv_buf, s + 1, k);
      }
    }
    for (auto& w : sends) w->wait();
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} (ring) did not complete: {}", what, e.what()));
  }
}

CommWork Comm::broadcast_async(const at::Tensor& t, int root, Transport algo) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("broadcast", t);
  if (root < 0 || root >= size()) {
    throw std::invalid_argument(fmt::format("broadcast on group '{}': root {} outside 0..{}", name_, root, size() - 1));
  }
  if (const auto d = staging(t)) {
    at::Tensor s = t.to(*d);
    return followed(broadcast_async(s, root, algo), [t, s]() { t.copy_(s); });
  }
  count("broadcast", t, 1.0);
  begin(CallKind::Broadcast, t, root);
  CommWork w = make_work("broadcast", t);
  if (size() == 1) { w.done_ = true; return w; }
  if (resolve(algo, t) == Transport::Shm) {
    run_sync(w, [&] { shm_broadcast(t, root, w.what_); });
    return w;
  }
  agree_native(w);
  std::vector<at::Tensor> v{as_transport(t, native_bf16())};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  w.works_.push_back(pg_->broadcast(v, opts));
  if (index_ != root) moved("broadcast", -1, t.numel() * t.element_size());  // received, inside Gloo
  return w;
}

void Comm::all_to_all(const at::Tensor& out, const at::Tensor& in, std::vector<int64_t> out_splits,
                      std::vector<int64_t> in_splits, Transport algo) {
  BlockedTimer timer(&blocked_s_);
  check_contiguous("all_to_all", out);
  check_contiguous("all_to_all", in);
  check_same_dtype("all_to_all", out, in);
  if (const auto d = staging(in)) {
    at::Tensor so = at::empty(out.sizes(), out.options().device(*d));
    all_to_all(so, in.to(*d), std::move(out_splits), std::move(in_splits), algo);
    out.copy_(so);
    return;
  }
  const int n = size();
  auto check_splits = [&](const char* which, const std::vector<int64_t>& splits, const at::Tensor& t) {
    if (splits.empty()) {
      if (t.dim() == 0 || t.size(0) % n != 0) {
        throw std::invalid_argument(fmt::format("all_to_all on group '{}': {} dim 0 ({}) is not divisible by {}; "
                                                "pass explicit splits",
                                                name_, which, t.dim() ? t.size(0) : 0, n));
      }
      return;
    }
    int64_t total = 0;
    for (auto s : splits) total += s;
    if (static_cast<int>(splits.size()) != n || total != t.size(0)) {
      throw std::invalid_argument(fmt::format("all_to_all on group '{}': {} splits [{}] must be {} counts summing "
                                              "to dim 0 ({})",
                                              name_, which, fmt::join(splits, ", "), n, t.size(0)));
    }
  };
  check_splits("output", out_splits, out);
  check_splits("input", in_splits, in);
  const double own = in_splits.empty() ? 1.0 / n
                                       : (in.size(0) ? static_cast<double>(in_splits[index_]) / in.size(0) : 0.0);
  count("all_to_all", in, 1.0 - own);
  begin(CallKind::AllToAll, in);
  int64_t row = 1;  // elements of one row (from the shape: a rank may send no rows)
  for (int64_t d = 1; d < in.dim(); ++d) row *= in.size(d);
  if (!in_splits.empty()) call_.numel = row;  // ranks send different numbers of rows (call.h)
  CommWork w = make_work("all_to_all", in);
  if (n == 1) {
    out.copy_(in);
    return;
  }
  // Every rank asks for the same segment size (its need differs with uneven splits, and growing is collective).
  if (algo == Transport::Shm || (algo == Transport::Auto && kind_ == BackendKind::Gloo && in.is_cpu() &&
                                 shm(kAllToAllShmBytes))) {
    if (algo == Transport::Shm) shm_or_throw(in, kAllToAllShmBytes, "all_to_all");
    auto bytes = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
      std::vector<int64_t> b;
      for (int r = 0; r < n; ++r) b.push_back((splits.empty() ? t.size(0) / n : splits[r]) * row * t.element_size());
      return b;
    };
    run_sync(w, [&] {
      shm_all_to_all(static_cast<uint8_t*>(out.data_ptr()), bytes(out_splits, out),
                     static_cast<const uint8_t*>(in.data_ptr()), bytes(in_splits, in), w.what_);
    });
    return;
  }
  agree_native(w);
  at::Tensor o = as_transport(out, native_bf16()), i = as_transport(in, native_bf16());
  // Counted first: alltoall_base takes the splits by reference and Gloo moves them away.
  for (int r = 0; r < n; ++r) {
    if (r != index_) moved("all_to_all", r, (in_splits.empty() ? in.size(0) / n : in_splits[r]) * row * in.element_size());
  }
  w.works_.push_back(pg_->alltoall_base(o, i, out_splits, in_splits));
  w.wait();
}

}  // namespace meshtrain
