#include "meshtrain/train/run_strategy.h"

#include "meshtrain/plan/spec.h"
#include "meshtrain/train/config.h"

namespace meshtrain {

plan::Strategy strategy_of(const TrainConfig& c, int dp) {
  plan::Strategy s;
  s.tp = c.tp;
  s.pp = c.pp;
  s.vpp = c.virtual_stages;
  if (c.pp > 1) s.pp_layers = stage_layer_counts(c);  // the engine's split: the ledger counts each rank's layers
  s.schedule = plan::parse_schedule(c.schedule);
  s.dp = dp / c.ep;  // `dp`: the data-parallel replicas, dp x ep
  s.ep = c.ep;
  s.cp = c.cp;
  s.cp_impl = plan::parse_cp_impl(c.cp_impl);
  s.sp = c.sp && c.tp > 1;
  s.flash = plan::attention_tiled(c.model.attention, c.seq, c.document_mask) ||
            plan::attention_sdpa(c.model.attention, c.model.dropout, c.document_mask, c.cp, c.device == "cuda");
  s.fused_loss = true;  // the head never carries an adapter (Transformer::linears): its loss is always fused
  s.zero = c.zero;
  s.dp_shard = c.dp_shard;
  s.micro_batch = c.micro_batch;
  s.global_batch = c.global_batch;
  s.seq = c.seq;
  s.precision = c.precision == "fp32"  ? plan::Precision::Fp32
                : c.precision == "fp8" ? plan::Precision::Fp8
                                       : plan::Precision::Bf16;
  s.recompute = plan::parse_recompute(c.recompute);
  return s;
}

}  // namespace meshtrain
