// Flight recorder: every process keeps its last N communication calls (the
// collectives and point-to-point calls of every group: group, sequence, op,
// dtype, element count, start and end time, state) in a ring buffer, and
// writes them to $MESHTRAIN_FLIGHT_DIR/rank_<R>.json when one fails or times
// out, or on SIGUSR1. The launcher sets that directory, asks every live rank
// for its record when a rank fails, and prints one report (hang_report.h):
// which rank is behind, at which call, and the first call where ranks diverge.
// PyTorch's NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) is the model.
//
// Cost per call: one uncontended mutex and a fixed-size copy (no allocation
// once the ring is full; group names are interned).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/comm/call.h"

namespace meshtrain {

enum class CallState { Started, Completed, Failed };
const char* to_string(CallState s);

struct FlightEntry {
  uint64_t id = 0;   // 1, 2, ... in this process
  int group = -1;    // index into FlightRecorder::groups()
  CallDesc call;
  double start = 0;  // seconds since the epoch (comparable between ranks of one host)
  double end = 0;    // 0 while in flight
  CallState state = CallState::Started;
};

struct FlightGroup {
  std::string name;
  std::vector<int> ranks;  // global ranks in group order
};

class FlightRecorder {
 public:
  // The process's recorder; its size is MESHTRAIN_FLIGHT_RECORDER (default 2000 calls, 0 = off).
  static FlightRecorder& instance();

  // Registers a group (by name and global ranks); returns its index.
  int group(const std::string& name, const std::vector<int>& ranks);
  // A call starts; returns its id (0 when the recorder is off).
  uint64_t start(int group, const CallDesc& call);
  void end(uint64_t id, CallState state);

  std::vector<FlightEntry> entries() const;  // oldest first
  std::vector<FlightGroup> groups() const;

  // Writes the record as JSON to $MESHTRAIN_FLIGHT_DIR/rank_<RANK>.json
  // (atomically; nothing without the variable). `reason` says why.
  void dump(const std::string& reason) const;
  std::string to_json(const std::string& reason) const;

  // SIGUSR1 makes this process dump its record (a thread waits for it; the
  // handler only writes to a pipe). Idempotent.
  static void install_signal_handler();

 private:
  explicit FlightRecorder(size_t capacity);
  mutable std::mutex mu_;
  size_t capacity_;
  std::vector<FlightEntry> ring_;
  uint64_t next_id_ = 1;
  std::vector<FlightGroup> groups_;
};

}  // namespace meshtrain
