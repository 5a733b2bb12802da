#include "meshtrain/parallel/context/attention.h"

#include "meshtrain/comm/comm.h"
#include "meshtrain/parallel/context/ring_attention.h"

namespace meshtrain {

at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp,
                             plan::CpImpl impl, const AttentionCore& core) {
  switch (impl) {
    case plan::CpImpl::Ring: return ring_attention(q, k, v, cp);
    case plan::CpImpl::Ulysses: return ulysses_attention(q, k, v, cp, core);
    case plan::CpImpl::AllGather: return allgather_kv_attention(q, k, v, cp, core);
  }
  throw std::logic_error("context_attention: unknown implementation");
}

}  // namespace meshtrain
