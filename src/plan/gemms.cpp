#include "meshtrain/plan/gemms.h"

#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain::plan {
namespace {

// The three GEMMs of a linear in -> out over n tokens, `count` of them per step.
void linear(std::vector<Gemm>& out, const std::string& name, int64_t n, int64_t in, int64_t o, int64_t count) {
  out.push_back({name + " forward", 1, n, o, in, false, true, count});  // x Wᵀ
  out.push_back({name + " dx", 1, n, in, o, false, false, count});      // dy W
  out.push_back({name + " dW", 1, o, in, n, true, false, count});       // dyᵀ x
}

}  // namespace

std::vector<Gemm> step_gemms(const ModelSpec& m, int64_t micro_batch, int64_t seq) {
  if (m.moe()) throw std::invalid_argument(fmt::format("{}: step_gemms counts dense models only", m.name));
  if (micro_batch < 1 || seq < 1) throw std::invalid_argument("step_gemms: micro_batch and seq must be positive");
  const int64_t n = micro_batch * seq, h = m.hidden, d = m.head_dim(), L = m.layers;
  std::vector<Gemm> g;
  linear(g, "attention q", n, h, m.heads * d, L);
  linear(g, "attention k", n, h, m.kv_heads * d, L);
  linear(g, "attention v", n, h, m.kv_heads * d, L);
  const int64_t bh = micro_batch * m.heads;
  g.push_back({"attention Q Kᵀ", bh, seq, seq, d, false, true, L});
  g.push_back({"attention P V", bh, seq, d, seq, false, false, L});
  g.push_back({"attention dP = dO Vᵀ", bh, seq, seq, d, false, true, L});
  g.push_back({"attention dV = Pᵀ dO", bh, seq, d, seq, true, false, L});
  g.push_back({"attention dQ = dS K", bh, seq, d, seq, false, false, L});
  g.push_back({"attention dK = dSᵀ Q", bh, d, seq, seq, true, false, L});
  linear(g, "attention o", n, m.heads * d, h, L);
  if (m.activation == Activation::SwiGLU) {
    linear(g, "mlp gate", n, h, m.ffn, L);
    linear(g, "mlp up", n, h, m.ffn, L);
  } else {
    linear(g, "mlp fc1", n, h, m.ffn, L);
  }
  linear(g, "mlp fc2", n, m.ffn, h, L);
  linear(g, "output layer", n, h, padded_vocab(m.vocab, 128), 1);
  return g;
}

}  // namespace meshtrain::plan
