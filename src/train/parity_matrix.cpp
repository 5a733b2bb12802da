#include "meshtrain/train/parity_matrix.h"

#include <fmt/format.h>

#include <limits>
#include <map>
#include <tuple>
#include <stdexcept>

namespace meshtrain {
namespace {

MatrixCell tested(std::string test = "") { return {"", false, std::move(test)}; }
MatrixCell refused(std::string error) { return {"", true, std::move(error)}; }

// Errors the config gives (config.cpp), quoted in several rows.
const char* kNoExperts = "splits the experts of MoE layers, and the model has none";
const char* kShardedPipeline = "with parallel.pp = 2: stage 2 would reduce-scatter";
const char* kMoeCp = "the router would see each cp rank's chunks alone";
const char* kDocumentMask = "train.document_mask needs model.attention";
const char* kWholeSequence = "needs each sequence whole on one rank";
const char* kRlMesh = "runs on data and tensor parallelism (DDP, no sequence parallelism) for now";
const char* kLoraMesh = "trains with DDP or ZeRO-1/2 for now";
const char* kCpDropout = "computes attention without dropout; set model.dropout = 0";

// One row: its cells in axis order (dp, tp, sp, cp, pp, ep).
MatrixRow row(std::string name, std::string feature, std::vector<std::string> sets, int dp,
              std::vector<MatrixCell> cells) {
  MatrixRow r;
  r.name = std::move(name);
  r.feature = std::move(feature);
  r.sets = std::move(sets);
  r.dp = dp;
  const auto& axes = matrix_axes();
  if (cells.size() != axes.size()) throw std::logic_error("parity matrix: row " + r.name + " has a cell per axis");
  for (size_t i = 0; i < cells.size(); ++i) cells[i].column = axes[i].name;
  r.cells = std::move(cells);
  return r;
}

std::vector<MatrixRow> build() {
  const MatrixCell T = tested();
  const std::vector<std::string> moe{"model.experts=4", "model.top_k=2", "model.aux_loss_coef=0.01"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<MatrixRow> rows{
      row("ddp", "DDP", {}, 2, {T, T, T, T, T, refused(kNoExperts)}),
      row("zero1", "ZeRO-1", {"parallel.zero=1"}, 2, {T, T, T, T, T, refused(kNoExperts)}),
      row("zero2", "ZeRO-2", {"parallel.zero=2"}, 2, {T, T, T, T, refused(kShardedPipeline), refused(kNoExperts)}),
      row("zero3", "ZeRO-3 (FSDP)", {"parallel.zero=3"}, 2,
          {T, T, T, T, refused("with parallel.pp = 2: stage 2 would reduce-scatter, and stage 3 re-gather"),
           refused(kNoExperts)}),
      row("hsdp", "HSDP (ZeRO-3 within 2 ranks, replicated across)", {"parallel.zero=3", "parallel.dp_shard=2"}, 2,
          {T, T, T, T, refused("stage 3 re-gather"), refused(kNoExperts)}),
      row("tp", "tensor parallel", {"parallel.tp=2"}, 1, {T, T, T, T, T, refused(kNoExperts)}),
      row("sp", "sequence parallel", {"parallel.tp=2", "parallel.sp=true"}, 1, {T, T, T, T, T, refused(kNoExperts)}),
      row("pp_gpipe", "pipeline, GPipe", {"parallel.pp=2", "parallel.schedule=\"gpipe\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("pp_1f1b", "pipeline, 1F1B", {"parallel.pp=2", "parallel.schedule=\"1f1b\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("pp_interleaved", "pipeline, interleaved (2 chunks per rank)",
          {"parallel.pp=2", "parallel.virtual=2", "parallel.schedule=\"interleaved\"", "model.layers=4"}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("pp_zb", "pipeline, zero bubble (ZB-H1)", {"parallel.pp=2", "parallel.schedule=\"zb-h1\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("cp_ring", "context parallel, ring attention", {"parallel.cp=2", "parallel.cp_impl=\"ring\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("cp_ulysses", "context parallel, Ulysses", {"parallel.cp=2", "parallel.cp_impl=\"ulysses\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("cp_allgather", "context parallel, all-gathered K/V", {"parallel.cp=2", "parallel.cp_impl=\"allgather\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("moe_dropless", "MoE, dropless (4 experts, top-2, aux loss)", moe, 1, {T, T, T, refused(kMoeCp), T, T}),
      // Experts split over ep 2 in the row's own mesh: its dp cell (ep 2 x dp 2) is where the experts'
      // gradients are reduced over their own replicas (dp x cp), apart from the dense ones.
      row("moe_ep", "MoE, experts over ep 2", with(moe, {"parallel.ep=2"}), 1, {T, T, T, refused(kMoeCp), T, T}),
      row("moe_capacity", "MoE, capacity factor 1.25", with(moe, {"model.capacity_factor=1.25"}), 1,
          {T, T, refused("capacity and drop priority would be per tp shard"), refused(kMoeCp), T, T}),
      row("recompute_full", "recomputation, full", {"train.recompute=\"full\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("recompute_selective", "recomputation, selective", {"train.recompute=\"selective\""}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("document_mask", "document masks (tiled attention)", {"train.document_mask=true", "model.attention=\"tiled\""},
          1, {T, T, T, refused(kDocumentMask), refused(kDocumentMask), refused(kNoExperts)}),
      row("spike_skip", "spike policy skip", {"spike.policy=\"skip\""}, 1, {T, T, T, T, T, refused(kNoExperts)}),
      row("spike_rollback", "spike policy rollback",
          {"spike.policy=\"rollback\"", "checkpoint.dir=\"{dir}\"", "checkpoint.every=2"}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      row("replica_check", "replica check every step", {"check.replicas_every=1"}, 1,
          {T, T, T, T, T, refused(kNoExperts)}),
      // Dropout, keyed by each element's place in the unsplit activations (model/transformer.h):
      // embedding, residual and attention probabilities, materialised and tiled.
      row("dropout", "dropout 0.1 (embedding, residual, attention)", {"model.dropout=0.1"}, 1,
          {T, T, T, refused(kCpDropout), T, refused(kNoExperts)}),
      row("dropout_tiled", "dropout 0.1, tiled attention", {"model.dropout=0.1", "model.attention=\"tiled\""}, 1,
          {T, T, T, refused(kCpDropout), T, refused(kNoExperts)}),
      // Adapters on the matrix's (randomly initialised) base: the base frozen, only the adapters trained,
      // their inputs dropped (LoRA's dropout, keyed like the model's).
      row("lora", "LoRA (rank 4, dropout 0.1)", {"lora.rank=4", "lora.dropout=0.1"}, 1,
          {T, T, T, T, refused(kLoraMesh), refused(kNoExperts)}),
      row("bottleneck", "bottleneck adapters (width 8)", {"adapters.bottleneck=8"}, 1,
          {T, T, T, T, refused("trains with DDP or ZeRO-1/2"), refused(kNoExperts)}),
      // A mixture of the matrix's data with itself at weights 1 and 2: Megatron-LM's blending order.
      row("mixture", "data mixture (2 sources)",
          {"data.train=[]", "data.sources=[{name=\"a\", path=\"{data}\", weight=1.0}, "
                            "{name=\"b\", path=\"{data}\", weight=2.0}]"},
          1, {T, T, T, T, T, refused(kNoExperts)}),
      row("sdpa", "attention through ATen's SDPA", {"model.attention=\"sdpa\""}, 1,
          {T, T, T, refused("sdpa"), T, refused(kNoExperts)}),
      // QLoRA: the base is a checkpoint of the matrix's run, quantised to NF4 under the adapters.
      row("qlora", "QLoRA (NF4 base, LoRA rank 4)", {"lora.rank=4", "lora.quantize=\"nf4\"", "init.from=\"{base}\""}, 1,
          {T, refused("quantises a pretrained base under LoRA adapters: it needs"),
           refused("quantises a pretrained base under LoRA adapters: it needs"), T, refused(kLoraMesh),
           refused(kNoExperts)}),
  };
  // Post-training on `meshtrain tokenize task --name arithmetic --seq 32 --count 40` ("{task}"):
  // 14 packed conversations (an epoch per step), 40 preference pairs (5 steps an epoch), 11 RL prompts
  // (2 or 4 a step). Each compares its own metrics beside the loss and the gradient norm.
  const std::string task_prefs = "data.train=\"{task}/prefs/train.bin\"";
  MatrixRow sft = row("sft", "SFT (packed conversations, assistant tokens trained)",
                      {"train.method=\"sft\"", "data.train=\"{task}/train.bin\""}, 1, {T, T, T, T, T, refused(kNoExperts)});
  MatrixRow dpo = row("dpo", "DPO (frozen reference copy)", {"train.method=\"dpo\"", task_prefs, "dpo.beta=0.5"}, 1,
                      {T, T, T, refused(kWholeSequence), refused(kWholeSequence), refused(kNoExperts)});
  dpo.metrics = {"margin", "rewards/chosen", "rewards/rejected"};
  // The reward model on the Llama shape: GPT's key bias has a gradient that is zero in exact arithmetic,
  // and Adam turns the layouts' rounding of it into lr-sized steps of either sign; measured (Intel Xeon):
  // tp 2 on gpt-tiny parts from one process by 1.02e-5 in the gradient norm, on llama-tiny by 7e-7.
  MatrixRow reward = row("reward", "reward model (Bradley-Terry)",
                         {"train.method=\"reward\"", task_prefs, "model.preset=\"llama-tiny\""}, 1,
                         {T, T, refused(kWholeSequence), refused(kWholeSequence), refused(kWholeSequence),
                          refused(kNoExperts)});
  reward.metrics = {"margin", "accuracy", "score/chosen", "score/rejected"};
  // RL: rollouts seeded per completion; rewards from a program (the count of odd digits in a completion,
  // so a group's completions differ and every step has a gradient).
  const std::vector<std::string> rl{"data.train=[]", "rl.prompts=\"{task}/prompts.jsonl\"", "rl.max_new=4",
                                    "rl.reward_command=\"awk -F[13579] '{ print (NF - 1) / 4 }'\""};
  MatrixRow grpo = row("grpo", "GRPO (4 completions a prompt)", with(rl, {"train.method=\"grpo\"", "rl.group=4"}), 1,
                       {T, T, refused(kRlMesh), refused(kRlMesh), refused(kRlMesh), refused(kNoExperts)});
  MatrixRow ppo = row("ppo", "PPO (actor, critic, frozen reference)",
                      with(rl, {"train.method=\"ppo\"", "rl.group=2", "ppo.kl_coef=0.1"}), 1,
                      {T, T, refused(kRlMesh), refused(kRlMesh), refused(kRlMesh), refused(kNoExperts)});
  // The k3 KL to a frozen reference (the run's initial weights), weighted by the importance ratio
  // as trl 1.x does by default (grpo.kl_ratio).
  MatrixRow grpo_kl = row("grpo_kl", "GRPO with the k3 KL to a frozen reference, times the ratio",
                          with(rl, {"train.method=\"grpo\"", "rl.group=4", "grpo.beta=0.1", "grpo.kl_ratio=true"}), 1,
                          {T, T, refused(kRlMesh), refused(kRlMesh), refused(kRlMesh), refused(kNoExperts)});
  grpo.metrics = {"reward", "entropy"};
  grpo_kl.metrics = {"reward", "entropy", "kl"};
  ppo.metrics = {"reward", "value_loss", "kl", "entropy"};
  grpo.loss_scale = grpo_kl.loss_scale = ppo.loss_scale = 1;
  for (MatrixRow* r : {&sft, &dpo, &reward, &grpo, &grpo_kl, &ppo}) rows.push_back(*r);
  // bf16 autocast: two reduction orders part by more than fp32's 1e-5 once a
  // weight rounds to another bf16 (2^-9); the band DDP itself keeps against
  // one process (ParityCli.Zero3InBf16IsDdpInBf16).
  // Measured at the matrix's lr 1e-3 (Intel Xeon): at most 2e-4 (loss) and 9e-4 (norm).
  for (auto [name, feature, attention] : {std::tuple{"bf16", "bf16 autocast", "auto"},
                                          std::tuple{"bf16_tiled", "bf16 autocast, tiled attention", "tiled"}}) {
    MatrixRow bf16 = row(name, feature, {"train.precision=\"bf16\"", fmt::format("model.attention=\"{}\"", attention)},
                         1, {T, T, T, T, T, refused(kNoExperts)});
    bf16.loss_tol = 2e-3;
    bf16.norm_tol = 1e-2;
    // The weights at the end: Adam's first steps are about lr x sign(g), and tp's and cp's bf16
    // partial sums flip the sign of small gradients; measured (Intel Xeon) at most 0.19 of the
    // distance travelled on tp, sp and cp, 0.005 on dp. This bound catches a weight left
    // untrained or saved stale, not rounding.
    bf16.weight_tol = 0.5;
    rows.push_back(bf16);
  }
  // fp16 autocast with the dynamic loss scaler (optim/loss_scaler.h; libtorch 2.11 has the CPU
  // kernels): every rank sees the same overflow (the check is all-reduced over tp and dp) and skips
  // or steps together. fp16 keeps 10 mantissa bits against bf16's 7, so the reduction orders part
  // less than bf16's; the bf16 row's bounds apply. Measured (AMD EPYC) weights at the end: 7e-4 of
  // the distance travelled on dp, 0.059 on tp and sp, 0.051 on cp. The pipeline has no loss scaler.
  MatrixRow fp16 = row("fp16", "fp16 autocast, dynamic loss scaling", {"train.precision=\"fp16\""}, 1,
                       {T, T, T, T, refused("the pipeline schedules have no loss scaler"), refused(kNoExperts)});
  fp16.loss_tol = 2e-3;
  fp16.norm_tol = 1e-2;
  fp16.weight_tol = 0.5;
  rows.push_back(fp16);
  // fp16 under ZeRO-1/2/3: the scaler checks and unscales the sharded gradients (ZeRO-2, -3) or
  // the whole gradients before the sharded step (ZeRO-1).
  for (int zero : {1, 2, 3}) {
    const MatrixCell pp = zero == 3   ? refused("with parallel.pp = 2: stage 2 would reduce-scatter, and stage 3 re-gather")
                          : zero == 2 ? refused(kShardedPipeline)
                                      : refused("the pipeline schedules have no loss scaler");
    MatrixRow r = row(fmt::format("fp16_zero{}", zero), fmt::format("fp16 autocast under ZeRO-{}", zero),
                      {"train.precision=\"fp16\"", fmt::format("parallel.zero={}", zero)}, 2,
                      {T, T, T, T, pp, refused(kNoExperts)});
    r.loss_tol = fp16.loss_tol, r.norm_tol = fp16.norm_tol, r.weight_tol = fp16.weight_tol;
    rows.push_back(r);
  }
  // FP8 (nn/fp8.h): the blocks' linears in e4m3/e5m2 with per-tensor scales, the rest bf16. Every
  // amax is reduced over the ranks that split the tensor (tp, cp) and, for delayed scaling, over the
  // data replicas, so each mesh quantises what one process quantises. pp computes exactly what one
  // process does (measured: loss bitwise, gradient norm 2e-9), dp up to the order of its gradient
  // sum (loss 3.2e-4, norm 8.5e-4: a weight an fp32 ulp apart rounds to the other e4m3 value now and
  // then). tp, sp and cp round their partial products and attention in bf16 as the bf16 rows do,
  // and FP8 amplifies that: a value moved across an fp8 rounding boundary moves by a whole e4m3
  // step (2^-3 of it, e5m2's 2^-2) where bf16's is 2^-8. Measured (AMD EPYC, both scalings): loss
  // at most 9.2e-4, gradient norm 1.4e-2 apart. Adam's sign-like first steps then carry the
  // small-gradient weights apart by about the distance travelled (0.87-0.90 on tp, sp, cp; 0.011 on
  // dp, 1e-6 on pp): there the per-step losses and norms are the check, not the weights.
  for (auto [name, feature, scaling] : {std::tuple{"fp8", "FP8 linears, current scaling", "current"},
                                        std::tuple{"fp8_delayed", "FP8 linears, delayed scaling", "delayed"}}) {
    MatrixRow fp8 = row(name, feature, {"train.precision=\"fp8\"", fmt::format("train.fp8_scaling=\"{}\"", scaling)},
                        1, {T, T, T, T, T, refused(kNoExperts)});
    fp8.loss_tol = 2e-3;
    fp8.norm_tol = 3e-2;
    fp8.weight_tol = 0.05;
    for (const char* column : {"tp", "sp", "cp"}) fp8.weight_tol_on[column] = std::numeric_limits<double>::infinity();
    rows.push_back(fp8);
  }
  return rows;
}

int value_of(const std::vector<std::string>& sets, const std::string& key, int fallback) {
  int v = fallback;
  for (const auto& s : sets) {
    if (s.rfind(key + "=", 0) == 0) v = std::stoi(s.substr(key.size() + 1));
  }
  return v;
}

}  // namespace

const std::vector<MatrixAxis>& matrix_axes() {
  static const std::vector<MatrixAxis> axes{
      {"dp", {}},  // the data ranks doubled (cell_run)
      {"tp", {"parallel.tp=2"}},
      {"sp", {"parallel.tp=2", "parallel.sp=true"}},
      {"cp", {"parallel.cp=2"}},
      {"pp", {"parallel.pp=2"}},
      {"ep", {"parallel.ep=2"}},
  };
  return axes;
}

const std::vector<MatrixRow>& parity_matrix() {
  static const std::vector<MatrixRow> rows = build();
  return rows;
}

std::string generic_test(const MatrixRow& row) { return "ParityMatrix/Row.Cells/" + row.name; }

CellRun cell_run(const MatrixRow& row, const MatrixAxis& axis) {
  CellRun r;
  r.sets = row.sets;
  r.sets.insert(r.sets.end(), axis.sets.begin(), axis.sets.end());
  const int dp = row.dp * (axis.name == "dp" ? 2 : 1);
  r.ranks = dp;
  for (const char* key : {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.ep"}) r.ranks *= value_of(r.sets, key, 1);
  r.sets.push_back(fmt::format("parallel.nproc={}", r.ranks));
  return r;
}

std::vector<std::string> reference_sets(const MatrixRow& row) {
  std::vector<std::string> out;
  for (const auto& s : row.sets) {
    if (s.rfind("parallel.", 0) != 0) out.push_back(s);
  }
  out.push_back("parallel.nproc=1");
  return out;
}

std::string matrix_markdown() {
  std::string out = "| feature |";
  for (const auto& a : matrix_axes()) out += " " + a.name + " |";
  out += "\n|---|";
  for (size_t i = 0; i < matrix_axes().size(); ++i) out += "---|";
  out += "\n";
  for (const auto& r : parity_matrix()) {
    out += fmt::format("| {} (`{}`) |", r.feature, r.name);
    for (const auto& c : r.cells) {
      out += c.refused ? fmt::format(" refused: \"{}\" |", c.what)
                       : fmt::format(" = `{}` |", c.what.empty() ? generic_test(r) : c.what);
    }
    out += "\n";
  }
  return out;
}

}  // namespace meshtrain
