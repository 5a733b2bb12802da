// All-gather K/V context parallelism (Llama 3, arXiv 2407.21783 sec. 3.3.2): see attention.h.
#include <ATen/Functions.h>

#include <vector>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/context/attention.h"
#include "meshtrain/parallel/context/zigzag.h"

namespace meshtrain {

at::Tensor allgather_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                                  const AttentionCore& core) {
  const int n = cp.size();
  const ZigZag z(q.size(2) * n, n, cp.rank());
  const at::Tensor natural = z.natural_order();
  // Forward all-gather, backward reduce-scatter (each rank's dK/dV summed over the ranks that read them).
  auto gather = [&](const at::Tensor& x) { return all_gather_seq(x.contiguous(), cp, 2).index_select(2, natural); };
  const at::Tensor kf = gather(k), vf = gather(v);  // [b, hkv, S, d]
  const auto [a, b] = z.chunks_of(cp.rank());
  std::vector<at::Tensor> rows;
  int64_t local = 0;
  for (int64_t c : {a, b}) {
    const int64_t end = (c + 1) * z.chunk();  // the chunk's queries see keys [0, end)
    rows.push_back(core(q.narrow(2, local * z.chunk(), z.chunk()), kf.narrow(2, 0, end), vf.narrow(2, 0, end)));
    ++local;
  }
  return at::cat(rows, 2);
}

}  // namespace meshtrain
