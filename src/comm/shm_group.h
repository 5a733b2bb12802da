// Internal: shared memory between the ranks of one group that run on one host.
//
// Over loopback TCP every byte a collective moves is copied twice by the kernel
// (into the socket, out of it), and on a host whose ranks share few cores those
// copies are the collective's cost. Ranks on one host can instead read each
// other's data where it lies, as NCCL's and MPI's intra-node transports do: each
// rank owns a segment in /dev/shm that every other rank of the group maps.
//
// Layout of a segment: one page of header (in group rank 0's segment: the
// barrier; in every segment: two slots for the rank's call description), then
// two buffers of `capacity` bytes. Operation k writes buffer k%2 and slot k%2.
//
// Invariant (why one barrier per operation suffices): a rank reads peers'
// buffers of operation k only after the barrier of k, and arrives at the barrier
// of k+1 only after those reads. So when any rank passes the barrier of k+1,
// every rank has finished reading operation k's buffers, and operation k+2 may
// overwrite them. The same holds for the call descriptions: every rank writes
// its own before the barrier and reads the others' after it (the agreement
// check), so ranks that disagree on a call learn it at its first barrier.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/call.h"
#include "meshtrain/compat.h"

namespace meshtrain {

// Segments are files "meshtrain-j<JOB>-<pid of rank 0>-<serial>-<rank>" in
// MESHTRAIN_SHM_DIR (default /dev/shm), JOB = MESHTRAIN_JOB (set by the
// launcher to its pid; 0 without one). Their names are unlinked once every
// rank has mapped them; a rank killed before that leaves its file, which the
// launcher removes when its ranks have exited (remove_job_segments).
std::string shm_directory();
// Removes the segment files of job `job`; returns how many.
int remove_job_segments(const std::string& job);

class ShmGroup {
 public:
  // Collective over `pg` (every rank of the group calls it with the same
  // `capacity`). Returns null on every rank when the ranks are not all on this
  // host, when any rank has MESHTRAIN_SHM=0, or when any rank cannot make or
  // map the segments in /dev/shm (or MESHTRAIN_SHM_DIR); `why` says which. Uses `pg` directly, so
  // the setup does not show in Comm's counters.
  static std::unique_ptr<ShmGroup> create(PGBackend& pg, int index, int size, int64_t capacity,
                                          std::chrono::milliseconds timeout, std::string* why);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int64_t capacity() const { return capacity_; }

  // Starts the next operation, the call `d`: selects its buffer in every
  // segment and publishes `d` to the other ranks (read after the barrier).
  void next(const CallDesc& d);
  // After a barrier: the first group rank whose call differs from this rank's
  // (its description in `theirs`), or -1 when every rank made the same call.
  int disagreeing(CallDesc* theirs) const;
  // This rank's buffer for the current operation (written before the barrier).
  uint8_t* mine() const { return buffer(index_); }
  // Rank r's buffer for the current operation (read after the barrier).
  const uint8_t* peer(int r) const { return buffer(r); }

  // Waits until every rank of the group has reached the barrier of the current
  // operation. Throws std::runtime_error when a rank's process is gone (checked
  // every 50 ms while waiting), or after `timeout` (a rank that never came: it
  // hangs, or it made a different call).
  void barrier();

 private:
  struct Header;
  ShmGroup(int index, int size, int64_t capacity, std::chrono::milliseconds timeout);
  uint8_t* buffer(int r) const;
  CallDesc* slot(int r) const;

  int index_, size_;
  int64_t capacity_;
  std::chrono::milliseconds timeout_;
  uint64_t op_ = 0;
  size_t map_bytes_ = 0;
  std::vector<uint8_t*> maps_;  // segment of each group rank, mapped here
  std::vector<int64_t> pids_;   // of each group rank; empty if some rank cannot see the others
  Header* header_ = nullptr;    // in rank 0's segment
};

}  // namespace meshtrain
