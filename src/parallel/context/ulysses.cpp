// Ulysses (Jacobs et al., arXiv 2309.14509): see attention.h.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/comm/autograd.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/context/attention.h"
#include "meshtrain/parallel/context/zigzag.h"

namespace meshtrain {

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                             const AttentionCore& core) {
  const int n = cp.size();
  if (q.size(1) % n != 0) {
    throw std::invalid_argument(fmt::format("ulysses: {} query heads on this rank are not divisible by cp {}; use "
                                            "cp_impl = ring or allgather",
                                            q.size(1), n));
  }
  const ZigZag z(q.size(2) * n, n, cp.rank());
  const at::Tensor natural = z.natural_order(), rank_major = z.rank_major_order();
  // Fewer kv heads than cp: each query head's kv head goes along with it.
  at::Tensor kk = k, vv = v;
  if (k.size(1) % n != 0) {
    kk = k.repeat_interleave(q.size(1) / k.size(1), 1);
    vv = v.repeat_interleave(q.size(1) / v.size(1), 1);
  }
  // [b, h, n, d] sequence shards -> [b, h/cp, S, d] head shards, in sequence order.
  auto to_heads = [&](const at::Tensor& x) { return all_to_all_dims(x, cp, 1, 2).index_select(2, natural); };
  const at::Tensor o = core(to_heads(q), to_heads(kk), to_heads(vv));
  return all_to_all_dims(o.index_select(2, rank_major), cp, 2, 1);
}

}  // namespace meshtrain
