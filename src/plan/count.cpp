#include "meshtrain/plan/count.h"

namespace meshtrain::plan {

namespace {

// A dense FFN of width f: GELU h->f->h; SwiGLU gate and up h->f, down f->h.
// {weights, column-parallel biases, row-parallel biases}.
struct Ffn {
  int64_t w = 0, col_b = 0, row_b = 0;
};
Ffn ffn(const ModelSpec& m, int64_t f) {
  const int64_t in_mats = m.activation == Activation::SwiGLU ? 2 : 1, b = m.bias ? 1 : 0;
  if (f == 0) return {};
  return {(in_mats + 1) * m.hidden * f, b * in_mats * f, b * m.hidden};
}

}  // namespace

ParamCount count_params(const ModelSpec& m, int64_t vocab_multiple) {
  validate(m);
  const int64_t h = m.hidden, a = m.heads, g = m.kv_heads, d = m.head_dim();
  const int64_t b = m.bias ? 1 : 0;
  const int64_t norm = m.norm == Norm::LayerNorm ? 2 * h : h;
  ParamCount c;
  // Attention: q (h x a.d), k and v (h x g.d each), o (a.d x h). Column-parallel
  // biases (q, k, v) split with tp; the row-parallel bias (o) is replicated.
  const int64_t attn_w = h * a * d + 2 * h * g * d + a * d * h;
  const int64_t attn_col_b = b * (a * d + 2 * g * d), attn_row_b = b * h;
  auto layer = [&](const Ffn& f, int64_t router, int64_t experts) {
    LayerParams l;
    l.attention = attn_w + attn_col_b + attn_row_b;
    l.mlp = f.w + f.col_b + f.row_b;
    l.norms = 2 * norm;
    l.router = router;
    l.expert = experts;
    l.tp_sharded = attn_w + attn_col_b + f.w + f.col_b;
    l.tp_replicated = attn_row_b + f.row_b + l.norms + l.router;
    return l;
  };
  const Ffn dense = ffn(m, m.ffn);
  c.layer = layer(dense, 0, 0);
  // A routed expert: the FFN's weights at width expert_ffn, no biases (moe/experts.h).
  const int64_t expert_w = m.moe() ? ffn(m, m.expert_width()).w : 0;
  const Ffn shared = m.moe() ? ffn(m, m.shared_experts * m.expert_width()) : Ffn{};
  if (m.moe()) c.moe_layer = layer(shared, h * m.experts, m.experts * expert_w);
  c.moe_layers = m.moe_layer_count();
  const int64_t dense_layers = m.layers - c.moe_layers;

  c.vocab_padded = padded_vocab(m.vocab, vocab_multiple);
  c.embedding = c.vocab_padded * h;
  c.positions = m.position == Position::Learned ? m.seq * h : 0;
  c.final_norm = norm;
  c.head = m.tied ? 0 : c.vocab_padded * h;
  c.total = dense_layers * c.layer.total() + c.moe_layers * c.moe_layer.total() + c.embedding + c.positions +
            c.final_norm + c.head;
  c.active = c.total - c.moe_layers * (m.experts - m.top_k) * expert_w;
  c.matmul_active = dense_layers * (attn_w + dense.w) +
                    c.moe_layers * (attn_w + shared.w + m.top_k * expert_w + c.moe_layer.router) +
                    c.vocab_padded * h;
  return c;
}

double train_flops_per_token(const ModelSpec& m, int64_t seq, AttnFlops conv) {
  const ParamCount c = count_params(m);
  const double attn = (conv == AttnFlops::Full ? 4.0 : 2.0) * m.layers * seq * m.heads * m.head_dim();
  return 3.0 * (2.0 * c.matmul_active + attn);
}

double adapter_train_flops_per_token(const ModelSpec& m, int64_t seq, int64_t adapter_params, AttnFlops conv) {
  const ParamCount c = count_params(m);
  const double attn = (conv == AttnFlops::Full ? 4.0 : 2.0) * m.layers * seq * m.heads * m.head_dim();
  return 4.0 * c.matmul_active + 6.0 * static_cast<double>(adapter_params) + 3.0 * attn;
}

std::string adapter_flops_formula(AttnFlops conv) {
  return conv == AttnFlops::Full ? "4 x N_matmul (frozen: no weight gradients) + 6 x N_adapters + 12 x L x s x a x "
                                   "d_head per token"
                                 : "4 x N_matmul (frozen: no weight gradients) + 6 x N_adapters + 6 x L x s x a x "
                                   "d_head per token (causal)";
}

std::string flops_formula(AttnFlops conv) {
  return conv == AttnFlops::Full
             ? "6 x N_matmul + 12 x L x s x a x d_head per token (attention square counted whole, as PaLM's MFU)"
             : "6 x N_matmul + 6 x L x s x a x d_head per token (causal: half the attention square)";
}

}  // namespace meshtrain::plan
