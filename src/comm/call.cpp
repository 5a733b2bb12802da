#include "meshtrain/comm/call.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include "meshtrain/comm/comm.h"

namespace meshtrain {

bool operator==(const CallDesc& a, const CallDesc& b) {
  return a.seq == b.seq && a.kind == b.kind && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root &&
         a.reduce == b.reduce;
}

const char* to_string(CallKind k) {
  switch (k) {
    case CallKind::None: return "nothing";
    case CallKind::AllReduce: return "all_reduce";
    case CallKind::AllGather: return "all_gather";
    case CallKind::ReduceScatter: return "reduce_scatter";
    case CallKind::Broadcast: return "broadcast";
    case CallKind::AllToAll: return "all_to_all";
    case CallKind::Barrier: return "barrier";
    case CallKind::Send: return "send";
    case CallKind::Recv: return "recv";
  }
  return "?";
}

std::string describe_call(const CallDesc& d) {
  std::string what = to_string(d.kind);
  if (d.reduce >= 0) what += fmt::format(" ({})", to_string(static_cast<ReduceOp>(d.reduce)));
  if (d.kind == CallKind::Broadcast) what += fmt::format(" (root {})", d.root);
  if (d.kind == CallKind::Send) what += fmt::format(" (to {})", d.root);
  if (d.kind == CallKind::Recv) what += fmt::format(" (from {})", d.root);
  what += fmt::format(" at sequence {}", d.seq);
  if (d.kind != CallKind::Barrier && d.kind != CallKind::None) {
    const char* type = d.dtype >= 0 && d.dtype < static_cast<int>(c10::ScalarType::NumOptions)
                           ? c10::toString(static_cast<c10::ScalarType>(d.dtype))
                           : "?";
    what += fmt::format(" of {} {} elements", d.numel, type);
  }
  return what;
}

std::string disagreement(const std::string& what, const std::string& group, int me, const CallDesc& mine, int other,
                         const CallDesc& theirs) {
  return fmt::format("{}: the ranks of group '{}' disagree on this call: group rank {} called {}, group rank {} called "
                     "{}; every rank of a group must make the same collective calls in the same order",
                     what, group, me, describe_call(mine), other, describe_call(theirs));
}

}  // namespace meshtrain
