#include "meshtrain/plan/count.h"

namespace meshtrain::plan {

ParamCount count_params(const ModelSpec& m, int64_t vocab_multiple) {
  validate(m);
  const int64_t h = m.hidden, a = m.heads, g = m.kv_heads, d = m.head_dim(), f = m.ffn;
  const int64_t b = m.bias ? 1 : 0;
  const int64_t norm = m.norm == Norm::LayerNorm ? 2 * h : h;
  ParamCount c;
  LayerParams& l = c.layer;
  // Attention: q (h x a.d), k and v (h x g.d each), o (a.d x h). Column-parallel
  // biases (q, k, v) split with tp; the row-parallel bias (o) is replicated.
  const int64_t attn_w = h * a * d + 2 * h * g * d + a * d * h;
  const int64_t attn_col_b = b * (a * d + 2 * g * d), attn_row_b = b * h;
  l.attention = attn_w + attn_col_b + attn_row_b;
  // FFN: GELU h->f->h; SwiGLU gate and up h->f, down f->h.
  const int64_t in_mats = m.activation == Activation::SwiGLU ? 2 : 1;
  const int64_t mlp_w = (in_mats + 1) * h * f, mlp_col_b = b * in_mats * f, mlp_row_b = b * h;
  const int64_t experts = m.moe() ? m.experts : 1;
  l.mlp = experts * (mlp_w + mlp_col_b + mlp_row_b);
  l.norms = 2 * norm;
  l.router = m.moe() ? h * m.experts : 0;
  l.tp_sharded = attn_w + attn_col_b + experts * (mlp_w + mlp_col_b);
  l.tp_replicated = attn_row_b + experts * mlp_row_b + l.norms + l.router;
  l.expert = m.moe() ? experts * (mlp_w + mlp_col_b) : 0;

  c.vocab_padded = padded_vocab(m.vocab, vocab_multiple);
  c.embedding = c.vocab_padded * h;
  c.positions = m.position == Position::Learned ? m.seq * h : 0;
  c.final_norm = norm;
  c.head = m.tied ? 0 : c.vocab_padded * h;
  c.total = m.layers * l.total() + c.embedding + c.positions + c.final_norm + c.head;
  const int64_t idle_experts = m.moe() ? (m.experts - m.top_k) * (mlp_w + mlp_col_b + mlp_row_b) : 0;
  c.active = c.total - m.layers * idle_experts;
  const int64_t active_experts = m.moe() ? m.top_k : 1;
  c.matmul_active = m.layers * (attn_w + active_experts * mlp_w + l.router) + c.vocab_padded * h;
  return c;
}

double train_flops_per_token(const ModelSpec& m, int64_t seq, AttnFlops conv) {
  const ParamCount c = count_params(m);
  const double attn = (conv == AttnFlops::Full ? 4.0 : 2.0) * m.layers * seq * m.heads * m.head_dim();
  return 3.0 * (2.0 * c.matmul_active + attn);
}

std::string flops_formula(AttnFlops conv) {
  return conv == AttnFlops::Full
             ? "6 x N_matmul + 12 x L x s x a x d_head per token (attention square counted whole, as PaLM's MFU)"
             : "6 x N_matmul + 6 x L x s x a x d_head per token (causal: half the attention square)";
}

}  // namespace meshtrain::plan
