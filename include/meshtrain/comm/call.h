// What one collective call is, as every rank of its group must agree: the
// agreement checks (comm.h) compare these between ranks, and the flight
// recorder (flight_recorder.h) keeps the last ones of each rank.
//
// Plain data of fixed size: it is written into shared memory and exchanged
// over Gloo as int64 words.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain {

enum class CallKind : int32_t { None, AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Barrier, Send, Recv };

struct CallDesc {
  uint64_t seq = 0;  // the group's collective sequence number (point-to-point calls count apart)
  CallKind kind = CallKind::None;
  int32_t dtype = -1;   // c10::ScalarType
  // Elements of the call's defining tensor (comm.h: nccl-tests' "size" tensor,
  // per rank); an all-to-all with splits: the elements of one row (its ranks
  // send different numbers of rows, of one width).
  int64_t numel = 0;
  int32_t root = -1;    // broadcast's root, a send's destination, a receive's source (group ranks)
  int32_t reduce = -1;  // ReduceOp for reductions
};

bool operator==(const CallDesc& a, const CallDesc& b);
inline bool operator!=(const CallDesc& a, const CallDesc& b) { return !(a == b); }

const char* to_string(CallKind k);
// "all_reduce (sum) at sequence 7 of 1024 Float elements"
std::string describe_call(const CallDesc& d);
// The agreement checks' error: "<what>: the ranks of group 'G' disagree on this
// call: group rank 0 called ..., group rank 1 called ...", naming both calls.
std::string disagreement(const std::string& what, const std::string& group, int me, const CallDesc& mine, int other,
                         const CallDesc& theirs);

}  // namespace meshtrain
