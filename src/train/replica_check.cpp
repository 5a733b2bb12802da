#include "meshtrain/train/replica_check.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <map>

#include "meshtrain/comm/comm.h"

namespace meshtrain {

std::vector<ReplicaMismatch> compare_replicas(const std::vector<Param>& params, Comm& replicas) {
  const int n = replicas.size();
  if (n == 1 || params.empty()) return {};
  const auto count = static_cast<int64_t>(params.size());
  at::Tensor mine = at::empty({count}, at::kLong);
  for (int64_t i = 0; i < count; ++i) {
    const at::Tensor t = params[static_cast<size_t>(i)].tensor.detach().cpu().contiguous();
    mine[i] = static_cast<int64_t>(XXH64(t.data_ptr(), t.nbytes(), 0));
  }
  at::Tensor all = at::empty({n, count}, at::kLong);
  replicas.all_gather(all, mine);
  std::vector<ReplicaMismatch> out;
  const auto* h = all.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    std::map<int64_t, int> votes;
    for (int r = 0; r < n; ++r) ++votes[h[r * count + i]];
    if (votes.size() == 1) continue;
    int64_t majority = 0;
    int most = 0;
    bool tie = false;
    for (const auto& [hash, v] : votes) {
      if (v > most) {
        most = v;
        majority = hash;
        tie = false;
      } else if (v == most) {
        tie = true;
      }
    }
    ReplicaMismatch m{params[static_cast<size_t>(i)].name, {}, n};
    for (int r = 0; r < n; ++r) {
      if (tie || h[r * count + i] != majority) m.ranks.push_back(replicas.ranks()[static_cast<size_t>(r)]);
    }
    out.push_back(m);
  }
  return out;
}

std::string replica_report(const std::vector<ReplicaMismatch>& mismatches) {
  std::string out;
  for (const auto& m : mismatches) {
    const bool majority = static_cast<int>(m.ranks.size()) * 2 < m.replicas;
    out += fmt::format("{} differs on rank{} {} ({} of {} replicas{})\n", m.param, m.ranks.size() == 1 ? "" : "s",
                       fmt::join(m.ranks, ", "), m.ranks.size(), m.replicas,
                       majority ? "" : "; no majority: any of them may be the corrupt one");
  }
  return out;
}

}  // namespace meshtrain
