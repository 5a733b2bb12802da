// Comm's collectives over the shared memory of ranks on one host
// (comm/shm_group.h): set-up on first use, and all_reduce, broadcast,
// all_gather, reduce_scatter and all_to_all piece by piece.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "comm/local_reduce.h"
#include "comm/shm_group.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/comm/transport_env.h"

namespace meshtrain {
namespace {
// The largest buffer of a shared-memory group (two per rank in /dev/shm); larger
// ops run in pieces. Measured: 64 MiB ops in 32 MiB pieces are as fast as whole.
constexpr int64_t kShmPieceBytes = int64_t{32} << 20;


// Elements per piece of a shared-memory op whose buffer holds `per_element`
// bytes for each element of the piece: ops larger than one buffer run piece by
// piece, so the segments stay bounded (kShmPieceBytes per buffer).
int64_t piece_elements(const ShmGroup& g, int64_t per_element) {
  return std::max<int64_t>(1, g.capacity() / per_element);
}

// The barrier of the current operation, then the agreement check: every rank
// compares every other rank's call with its own `mine` (so all throw alike).
void shm_barrier(ShmGroup& g, const std::string& what, const std::string& group, int me, const CallDesc& mine) {
  try {
    g.barrier();
  } catch (const std::exception& e) {
    throw CommError(fmt::format("{} (shm) did not complete: {}", what, e.what()));
  }
  CallDesc theirs;
  if (const int r = g.disagreeing(&theirs); r >= 0) {
    throw CommError(disagreement(what + " (shm)", group, me, mine, r, theirs));
  }
}

// An all-to-all's published headers (`header(r, i)`: rank r's i-th int64:
// n + 1 chunk offsets, then the bytes it expects from each rank): every pair's
// sent and expected sizes agree, or every rank throws the same error.
template <class Header>
void check_chunk_sizes(int n, const Header& header, const std::string& what) {
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      const int64_t sent = header(r, q + 1) - header(r, q), expected = header(q, n + 1 + r);
      if (sent != expected) {
        throw CommError(fmt::format("{} (shm): group rank {} sends {} bytes to group rank {}, which expects {} "
                                    "(the splits must match: in_splits on the sender, out_splits on the receiver)",
                                    what, r, sent, q, expected));
      }
    }
  }
}

at::Tensor peer_tensor(const uint8_t* p, int64_t numel, const at::Tensor& like) {
  return at::from_blob(const_cast<uint8_t*>(p), {numel}, like.options());
}

}  // namespace

bool Comm::shm_available() { return shm(1) != nullptr; }

ShmGroup* Comm::shm(int64_t bytes) {
  if (shm_off_ || kind_ != BackendKind::Gloo || size() < 2) return nullptr;
  bytes = std::min(bytes, kShmPieceBytes);
  if (shm_ && shm_->capacity() >= bytes) return shm_.get();
  if (shm_ && call_.kind != CallKind::None) {
    // Growing is collective over Gloo: first agree on the call through the
    // segments we have, so a rank whose call needs no growth (it disagrees)
    // fails with the others here instead of all waiting in different places.
    shm_->next(call_);
    shm_barrier(*shm_, fmt::format("{} on group '{}'", describe_call(call_), name_), name_, index_, call_);
  }
  // Grow to a power of two (at least 1 MiB), so a run's few sizes settle fast.
  int64_t capacity = int64_t{1} << 20;
  while (capacity < bytes) capacity *= 2;
  shm_.reset();  // the old segments go first: the new ones take their place in /dev/shm
  shm_ = ShmGroup::create(*pg_, index_, size(), capacity, timeout_, &shm_why_);
  if (!shm_) {
    shm_off_ = true;  // every rank got the same answer (create agrees over the group)
    if (shm_why_.rfind("cannot", 0) == 0) {  // this rank's own failure: say it here
      std::cerr << fmt::format("meshtrain: group '{}' collectives go over Gloo, not shared memory: {}\n", name_,
                               shm_why_);
    }
  }
  return shm_.get();
}

Transport Comm::resolve(Transport chosen, const at::Tensor& t) {
  if (chosen != Transport::Auto) return chosen;
  const bool shared = kind_ == BackendKind::Gloo && t.is_cpu() && shm(t.numel() * t.element_size());
  return shared ? Transport::Shm : Transport::Native;
}

ShmGroup& Comm::shm_or_throw(const at::Tensor& t, int64_t bytes, const char* op) {
  if (!t.is_cpu()) {
    throw std::invalid_argument(
        fmt::format("{} algorithm 'shm' on group '{}': the tensor is on {}, shared memory holds CPU tensors; use auto",
                    op, name_, t.device().str()));
  }
  ShmGroup* g = shm(bytes);
  if (!g) {
    throw std::invalid_argument(fmt::format(
        "{} algorithm 'shm' on group '{}': the group has no shared memory ({}); use auto", op, name_,
        kind_ != BackendKind::Gloo ? "not a Gloo group" : size() < 2 ? "one rank" : shm_why_));
  }
  return *g;
}


// Per piece: each rank copies its piece into its segment; after the barrier
// it reduces part `me` (1/n of the piece) over every segment, in rank order,
// into its own segment (no other rank reads that part of it before the second
// barrier); after the second barrier each copies every reduced part out.
void Comm::shm_all_reduce(const at::Tensor& t, ReduceOp op, const std::string& what) {
  const int n = size(), me = index_;
  const int64_t elem = t.element_size(), numel = t.numel();
  ShmGroup& g = shm_or_throw(t, numel * elem, "all_reduce");
  const int64_t step = piece_elements(g, elem);
  at::Tensor flat = t.view(-1);
  auto* data = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t lo = 0; lo < numel; lo += step) {
    const int64_t len = std::min(step, numel - lo);
    const int64_t a = len * me / n, b = len * (me + 1) / n;  // part `me` of the piece
    g.next(call_);
    std::memcpy(g.mine(), data + lo * elem, len * elem);
    shm_barrier(g, what, name_, index_, call_);
    if (b > a) {
      std::vector<at::Tensor> rows;
      for (int r = 0; r < n; ++r) rows.push_back(peer_tensor(g.peer(r) + a * elem, b - a, t));
      for (int r = 0; r < n; ++r) {
        if (r != me) moved("all_reduce", r, (b - a) * elem);
      }
      reduce_rows(peer_tensor(g.mine() + a * elem, b - a, t), rows, op);
    }
    shm_barrier(g, what, name_, index_, call_);
    for (int r = 0; r < n; ++r) {
      const int64_t ra = len * r / n, rb = len * (r + 1) / n;
      std::memcpy(data + (lo + ra) * elem, g.peer(r) + ra * elem, (rb - ra) * elem);
      if (r != me) moved("all_reduce", r, (rb - ra) * elem);
    }
  }
}

// Per piece: the root copies its piece into its segment; after the barrier the
// others copy it out.
void Comm::shm_broadcast(const at::Tensor& t, int root, const std::string& what) {
  const int64_t elem = t.element_size(), numel = t.numel();
  ShmGroup& g = shm_or_throw(t, numel * elem, "broadcast");
  const int64_t step = piece_elements(g, elem);
  auto* data = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t lo = 0; lo < numel; lo += step) {
    const int64_t bytes = std::min(step, numel - lo) * elem;
    g.next(call_);
    if (index_ == root) std::memcpy(g.mine(), data + lo * elem, bytes);
    shm_barrier(g, what, name_, index_, call_);
    if (index_ != root) {
      std::memcpy(data + lo * elem, g.peer(root), bytes);
      moved("broadcast", root, bytes);
    }
  }
}

// Per piece: each rank puts its piece of the input in its segment; after the
// barrier every rank copies every segment out. `in` may be this rank's slice
// of `out`.
void Comm::shm_all_gather(const at::Tensor& o, const at::Tensor& i, const std::string& what) {
  const int n = size(), me = index_;
  const int64_t elem = i.element_size(), m = i.numel();
  ShmGroup& g = shm_or_throw(i, m * elem, "all_gather");
  const int64_t step = piece_elements(g, elem);
  const auto* src = static_cast<const uint8_t*>(i.data_ptr());
  auto* dst = static_cast<uint8_t*>(o.data_ptr());
  for (int64_t lo = 0; lo < m; lo += step) {
    const int64_t bytes = std::min(step, m - lo) * elem;
    g.next(call_);
    std::memcpy(g.mine(), src + lo * elem, bytes);
    shm_barrier(g, what, name_, index_, call_);
    for (int r = 0; r < n; ++r) {
      const uint8_t* from = r == me ? src + lo * elem : g.peer(r);
      uint8_t* to = dst + (r * m + lo) * elem;
      if (from != to) std::memmove(to, from, bytes);
      if (r != me) moved("all_gather", r, bytes);
    }
  }
}

// Per piece (the same element range of every chunk): each rank copies the
// pieces the others own into its segment; after the barrier each sums its own
// over the ranks in rank order, reading its own contribution from `in` and the
// others' from their segments (one pass for fp32: local_reduce.h). `out` may be
// this rank's chunk of `in`.
void Comm::shm_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, const std::string& what) {
  const int n = size(), me = index_;
  const int64_t elem = in.element_size(), m = out.numel();
  ShmGroup& g = shm_or_throw(in, n * m * elem, "reduce_scatter");
  const int64_t step = piece_elements(g, n * elem);
  const auto* src = static_cast<const uint8_t*>(in.data_ptr());
  at::Tensor o = out.view(-1), chunk = in.view(-1).narrow(0, me * m, m);
  for (int64_t lo = 0; lo < m; lo += step) {
    const int64_t len = std::min(step, m - lo), bytes = len * elem;
    g.next(call_);
    for (int r = 0; r < n; ++r) {
      if (r != me) std::memcpy(g.mine() + r * bytes, src + (r * m + lo) * elem, bytes);
    }
    shm_barrier(g, what, name_, index_, call_);
    std::vector<at::Tensor> rows;
    for (int r = 0; r < n; ++r) {
      rows.push_back(r == me ? chunk.narrow(0, lo, len) : peer_tensor(g.peer(r) + me * bytes, len, in));
      if (r != me) moved("reduce_scatter", r, bytes);
    }
    reduce_rows(o.narrow(0, lo, len), rows, op);
  }
}

// In rounds: each rank writes its chunk offsets (n + 1 byte offsets into its
// input, the last its total) and the bytes it expects from each rank at the
// head of its segment, and the round's piece of its input after them; after
// the barrier every rank copies, from each peer, the part of that piece that
// is its chunk. The first round's headers tell every rank every total, hence
// the number of rounds (the same on all), and every pair's sent and expected
// sizes (so a mismatch is the same error on every rank). A rank's own chunk is
// copied locally. Ranks may send and receive nothing.
void Comm::shm_all_to_all(uint8_t* out, const std::vector<int64_t>& out_bytes, const uint8_t* in,
                          const std::vector<int64_t>& in_bytes, const std::string& what) {
  const int n = size(), me = index_;
  ShmGroup& g = *shm(1);  // sized by the caller (every rank alike)
  std::vector<int64_t> header(2 * n + 1, 0), out_off(n + 1, 0);  // input offsets, then bytes expected
  for (int r = 0; r < n; ++r) {
    header[r + 1] = header[r] + in_bytes[r];
    header[n + 1 + r] = out_bytes[r];
    out_off[r + 1] = out_off[r] + out_bytes[r];
  }
  const int64_t head = static_cast<int64_t>(header.size() * sizeof(int64_t));
  const int64_t room = g.capacity() - head;  // input bytes per round
  auto peer_header = [&](int r, int i) {
    int64_t v;
    std::memcpy(&v, g.peer(r) + i * sizeof(int64_t), sizeof v);
    return v;
  };
  std::memcpy(out + out_off[me], in + header[me], in_bytes[me]);
  if (cma_ready(g, what)) {
    cma_all_to_all(g, out, out_off, in, header, what);
    return;
  }
  int64_t rounds = 1;
  for (int64_t k = 0; k < rounds; ++k) {
    g.next(call_);
    std::memcpy(g.mine(), header.data(), head);
    const int64_t lo = k * room, len = std::clamp<int64_t>(header[n] - lo, 0, room);
    if (len > 0) std::memcpy(g.mine() + head, in + lo, len);
    shm_barrier(g, what, name_, index_, call_);
    if (k == 0) {
      for (int r = 0; r < n; ++r) rounds = std::max(rounds, (peer_header(r, n) + room - 1) / room);
      check_chunk_sizes(n, peer_header, what);
    }
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const int64_t from = peer_header(r, me), to = peer_header(r, me + 1);  // their chunk for me
      const int64_t a = std::max(from, lo), b = std::min(to, lo + room);
      if (b > a) {
        std::memcpy(out + out_off[r] + (a - from), g.peer(r) + head + (a - lo), b - a);
        moved("all_to_all", r, b - a);
      }
    }
  }
}

// Cross-memory attach (process_vm_readv, Linux 3.2): a rank reads a peer's
// memory in one copy, where the segment path copies twice (into the segment,
// out of it). Yama's ptrace_scope 1 allows it only into descendants, so each
// rank first lets any of its user's processes read it (PR_SET_PTRACER_ANY, as
// UCX's CMA transport does); containers may still forbid it: every rank probes
// every peer once, and the group uses it only if all succeed
// (MESHTRAIN_SHM_CMA=0 turns it off).
bool Comm::cma_ready(ShmGroup& g, const std::string& what) {
  if (cma_ >= 0) return cma_ == 1;
  const int n = size(), me = index_;
  bool ok = transport_switch("MESHTRAIN_SHM_CMA");
  if (ok) {  // opted out: the process stays closed to its user's other processes
    static const int allowed = prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    (void)allowed;  // fails harmlessly where Yama is absent
  }
  const int64_t probe = 0x6d657368 + me;  // read by the peers during the two operations below
  const int64_t mine[2] = {static_cast<int64_t>(getpid()), static_cast<int64_t>(reinterpret_cast<intptr_t>(&probe))};
  g.next(call_);
  std::memcpy(g.mine(), mine, sizeof mine);
  shm_barrier(g, what, name_, index_, call_);
  for (int r = 0; r < n && ok; ++r) {
    if (r == me) continue;
    int64_t theirs[2], value = 0;
    std::memcpy(theirs, g.peer(r), sizeof theirs);
    iovec local{&value, sizeof value}, remote{reinterpret_cast<void*>(static_cast<intptr_t>(theirs[1])), sizeof value};
    ok = process_vm_readv(static_cast<pid_t>(theirs[0]), &local, 1, &remote, 1, 0) == sizeof value &&
         value == 0x6d657368 + r;
  }
  g.next(call_);
  const int64_t flag = ok ? 1 : 0;
  std::memcpy(g.mine(), &flag, sizeof flag);
  shm_barrier(g, what, name_, index_, call_);
  cma_ = 1;
  for (int r = 0; r < n; ++r) {
    int64_t f;
    std::memcpy(&f, g.peer(r), sizeof f);
    if (f != 1) cma_ = 0;
  }
  return cma_ == 1;
}

// Each rank publishes its pid, its input's address and its chunk offsets and
// expected sizes; after the barrier it checks every pair's sizes (as the
// segment path does) and reads its chunk of every peer's input straight into
// its output; a second barrier keeps every input alive until all have read.
void Comm::cma_all_to_all(ShmGroup& g, uint8_t* out, const std::vector<int64_t>& out_off, const uint8_t* in,
                          const std::vector<int64_t>& header, const std::string& what) {
  const int n = size(), me = index_;
  std::vector<int64_t> h = header;
  h.push_back(static_cast<int64_t>(getpid()));
  h.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(in)));
  g.next(call_);
  std::memcpy(g.mine(), h.data(), h.size() * sizeof(int64_t));
  shm_barrier(g, what, name_, index_, call_);
  auto peer = [&](int r, size_t i) {
    int64_t v;
    std::memcpy(&v, g.peer(r) + i * sizeof(int64_t), sizeof v);
    return v;
  };
  check_chunk_sizes(n, peer, what);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const auto pid = static_cast<pid_t>(peer(r, 2 * n + 1));
    auto* base = reinterpret_cast<uint8_t*>(static_cast<intptr_t>(peer(r, 2 * n + 2)));
    int64_t done = 0;
    const int64_t from = peer(r, me), len = peer(r, me + 1) - from;
    while (done < len) {  // a read may stop short of the whole length
      iovec local{out + out_off[r] + done, static_cast<size_t>(len - done)};
      iovec remote{base + from + done, static_cast<size_t>(len - done)};
      const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        throw CommError(fmt::format("{} (shm): reading group rank {}'s input (process {}) failed: {}", what, r, pid,
                                    std::strerror(errno)));
      }
      done += got;
    }
    if (len > 0) moved("all_to_all", r, len);
  }
  g.next(call_);  // every rank has read every input it needed once all pass this barrier
  shm_barrier(g, what, name_, index_, call_);
}

}  // namespace meshtrain
