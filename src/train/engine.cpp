#include "meshtrain/train/engine.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

#include "meshtrain/plan/strategy.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/peft/qlora.h"
#include "meshtrain/moe/layer.h"
#include "meshtrain/train/method.h"
#include "meshtrain/train/pipeline_prediction.h"
#include "meshtrain/train/precision.h"
#include "meshtrain/train/state.h"

namespace meshtrain {
namespace {

std::vector<at::Tensor> slice(const std::vector<at::Tensor>& v, size_t first, size_t count) {
  return {v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(first + count)};
}

// The optimizer's entries for chunk `m`'s parameters, from entry `k` on,
// aligned with m.params(): undefined for frozen parameters (which have none).
// Advances k past them.
std::vector<at::Tensor> aligned(const std::vector<at::Tensor>& state, Transformer& m, size_t& k) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.params().params()) out.push_back(p.frozen ? at::Tensor() : state.at(k++));
  return out;
}

// One fp32 tensor per parameter to load a checkpoint into before ZeRO slices
// it: the parameter's current values where it holds them (adapters the
// checkpoint lacks keep their fresh ones), zeros where ZeRO-3 freed them.
std::vector<at::Tensor> current_params(Transformer& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.params().params()) {
    const bool held = p.tensor.storage().nbytes() >= static_cast<size_t>(p.tensor.numel()) * 4;
    out.push_back(held ? p.tensor.detach().to(at::kFloat).clone()
                       : at::zeros(p.tensor.sizes(), p.tensor.options().dtype(at::kFloat)));
  }
  return out;
}

}  // namespace

TrainEngine::TrainEngine(const TrainConfig& c, Runtime& rt, DeviceMesh& mesh, int64_t accumulation, bool lead,
                         EngineRole role)
    : c_(c),
      tp_(mesh.axis("tp")),
      pp_(mesh.axis("pp")),
      cp_(mesh.axis("cp")),
      dp_(dense_group(c, mesh)),
      expert_dp_(mesh.group({"dp", "cp"})),
      ep_(mesh.axis("ep")),
      precision_(parse_train_precision(c.precision)) {
  if (c.pp == 1) {
    chunks_.push_back(std::make_unique<Transformer>(c.model, tp_, c.sp, c.seed, StagePart{}, &ep_));
  } else {
    chunks_ = build_stages(c.model, tp_, c.sp, c.seed, pp_.rank(), c.pp, c.virtual_stages, c.pp_layers, c.pp_balance,
                           &ep_);
  }
  const Method& method = method_named(c.method);
  for (auto& m : chunks_) {
    if (c.lora.rank > 0) apply_lora(*m, c.lora);
    if (c.adapters.bottleneck > 0) apply_adapters(*m, c.adapters);
    if (method.prepare_model) method.prepare_model(c, role, *m);  // a critic's or reward model's value head
    m->set_context_parallel(cp_, plan::parse_cp_impl(c.cp_impl));
    m->set_recompute(plan::parse_recompute(c.recompute));
  }
  if (precision_ == Precision::Fp8) {
    std::vector<Transformer*> raw;
    for (auto& m : chunks_) raw.push_back(m.get());
    fp8_ = std::make_unique<Fp8Training>(
        nn::Fp8Recipe{nn::parse_fp8_scaling(c.fp8_scaling), c.fp8_history, c.fp8_margin}, raw, tp_, cp_);
  }
  if (c.zero > 0) {
    shard_groups_ = make_shard_groups(rt, dp_, c.dp_shard > 0 ? c.dp_shard : dp_.size());
    for (auto& m : chunks_) {
      zero_.push_back(std::make_unique<ShardedDataParallel>(
          *m, *shard_groups_.shard, *shard_groups_.replicate, tp_, c.optim,
          ZeroOptions{c.zero, c.ddp_find_unused, true, c.zero_param_dtype == "bf16",
                      ep_.size() > 1 ? &expert_dp_ : nullptr, c.offload}));
      for (const auto& p : zero_.back()->shard_params()) updated_.push_back(p);
    }
  } else {
    for (auto& m : chunks_) {
      for (const auto& p : m->params().params()) {
        if (!p.frozen) updated_.push_back(p);  // frozen (LoRA's base): no gradient, no optimizer state
      }
    }
    const DdpOptions ddp{c.ddp_bucket_mb << 20, c.ddp_overlap, c.ddp_find_unused};
    if (ep_.size() > 1 && c.pp == 1) {  // two DDPs: the experts' gradients cross only the ranks holding the same experts
      for (const auto& p : updated_) (p.expert ? experts_ : dense_).push_back(p);
      if (dp_.size() > 1) ddp_ = std::make_unique<DataParallel>(dense_, dp_, ddp);
      if (expert_dp_.size() > 1) ddp_experts_ = std::make_unique<DataParallel>(experts_, expert_dp_, ddp);
    } else if (dp_.size() > 1 && c.pp == 1) {
      ddp_ = std::make_unique<DataParallel>(updated_, dp_, ddp);
    }
  }
  opt_ = std::make_unique<AdamW>(updated_, c.optim);
  // ZeRO's slices are disjoint across its shard group already (zero.h): only whole experts sum over ep.
  if (ep_.size() > 1 && zero_.empty()) opt_->set_expert_group(&ep_);
  if (method.copy_reference && method.copy_reference(c, role)) {
    // The reference is the starting model: built from the same seed as the
    // policy, then given the same pinned [init] weights (load_reference), frozen.
    reference_ = std::make_unique<Transformer>(c.model, tp_, c.sp, c.seed);
    for (auto& p : reference_->params().params()) p.tensor.requires_grad_(false);
  }
  objective_ = method.objective ? method.objective(c, role, reference_.get()) : std::make_unique<NextTokenObjective>();
  if (precision_ == Precision::Fp16) scaler_ = std::make_unique<LossScaler>();
  std::vector<ShardedDataParallel*> zero_raw;
  for (auto& z : zero_) zero_raw.push_back(z.get());
  if (c.pp == 1) {
    StepOptions so{precision_, scaler_.get(), ddp_.get(), zero_raw.empty() ? nullptr : zero_raw[0], objective_.get()};
    if (ep_.size() > 1) {
      so.expert_dp = &expert_dp_;
      so.ddp_experts = ddp_experts_.get();
    }
    step_ = std::make_unique<TrainStep>(*chunks_[0], *opt_, dp_, tp_, so);
  } else {
    embed_ = make_embedding_group(rt, mesh.layout());
    plan::PipelineSchedule schedule;
    try {
      schedule = plan::build_schedule(plan::parse_schedule(c.schedule), c.pp, static_cast<int>(accumulation),
                                      c.virtual_stages);
      pipeline_prediction_ = predict_pipeline(c, static_cast<int>(accumulation));
      predicted_bubble_ = pipeline_prediction_.bubble;
      pipeline_note_ = compute_balance_note(c, static_cast<int>(accumulation), pipeline_prediction_);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("parallel.schedule = {} with pp {}, virtual {} and {} micro-batches per "
                                              "step (train.global_batch / (micro_batch x dp)): {}",
                                              c.schedule, c.pp, c.virtual_stages, accumulation, e.what()));
    }
    std::vector<Transformer*> raw;
    for (auto& m : chunks_) raw.push_back(m.get());
    const int64_t rows = (c.sp && tp_.size() > 1 ? c.seq / tp_.size() : c.seq) / c.cp;  // this rank's tokens
    exec_ = std::make_unique<PipelineExecutor>(schedule, raw, pp_, std::vector<int64_t>{rows, c.micro_batch,
                                                                                          c.model.hidden},
                                               embed_.get());
    pipeline_step_ = std::make_unique<PipelineTrainStep>(raw, *exec_, *opt_, dp_, tp_, pp_, zero_raw, precision_,
                                                         ep_.size() > 1 ? &expert_dp_ : nullptr);
  }
  if (!lead) return;
  if (c.pp > 1) {
    fmt::print("pipeline over {} ranks: {} schedule, {} chunk(s) per rank, {} micro-batches per step, predicted "
               "bubble {:.1f}% (rank 0 idle, the stages' work counted); layers per stage [{}] ({})\n",
               c.pp, c.schedule, c.virtual_stages, accumulation, 100 * predicted_bubble_,
               fmt::join(pipeline_prediction_.layers, ", "),
               c.pp_layers.empty() ? fmt::format("balanced by {}", plan::balance_name(c.pp_balance))
                                   : std::string("parallel.pp_layers"));
    if (!pipeline_note_.empty()) fmt::print("pipeline: {}\n", pipeline_note_);
  }
  if (!zero_.empty()) {
    const int replicas = shard_groups_.replicate->size();
    fmt::print("data parallel over {} ranks: ZeRO-{}{}, sharded over {} rank(s){}, {} flat buffers\n", dp_.size(), c.zero,
               c.zero == 3 ? " (FSDP: layers gathered before use, next one prefetched)" : "",
               shard_groups_.shard->size(), replicas > 1 ? fmt::format(", replicated {}x (HSDP)", replicas) : "",
               zero_[0]->flats());
  } else if (ddp_) {
    fmt::print("data parallel over {} ranks: DDP, {} bucket(s) of <= {} MiB, all-reduce {}\n", dp_.size(),
               ddp_->buckets(), c.ddp_bucket_mb, c.ddp_overlap ? "overlapped with backward" : "after backward");
  } else if (dp_.size() > 1) {
    fmt::print("data parallel over {} ranks: one flat all-reduce after the pipeline step\n", dp_.size());
  }
}

std::vector<std::vector<std::string>> mesh_groups(const TrainConfig& c) {
  if (c.ep == 1) return {{"dp", "cp"}};
  return {{"dp", "cp"}, {"dp", "cp", "ep"}, {"dp", "ep"}};
}

Comm& dense_group(const TrainConfig& c, DeviceMesh& mesh) {
  return c.ep > 1 ? mesh.group({"dp", "cp", "ep"}) : mesh.group({"dp", "cp"});
}

Comm& data_group(const TrainConfig& c, DeviceMesh& mesh) {
  return c.ep > 1 ? mesh.group({"dp", "ep"}) : mesh.axis("dp");
}

// What the method's data needs from the loader (Method::packed_info, pairs): documents for the
// mask, loss masks for SFT, DPO and reward models, pairs kept together for the last two.
LoaderOptions loader_options(const TrainConfig& c) {
  const Method* m = find_method(c.method);
  LoaderOptions o{c.document_mask, m && !m->packed_info.empty(), m && m->pairs ? 2 : 1};
  o.repack = c.method == "sft" && c.repack;  // SFT: conversations shuffled and packed afresh each epoch
  return o;
}

TokenLoader train_loader(const TrainConfig& c, int rank, int size, LoaderOptions o) {
  // Epochs end on whole global batches: at the same optimizer step on every mesh.
  o.accumulation = std::max<int64_t>(1, c.global_batch / (c.micro_batch * size));
  if (!c.sources.empty()) return TokenLoader(c.sources, c.seq, c.micro_batch, rank, size, c.seed, o);
  return TokenLoader(c.train_shards, c.seq, c.micro_batch, rank, size, c.seed, o);
}

StepResult TrainEngine::step(int64_t step, const std::vector<Batch>& micro, const UpdateGate& gate) {
  for (auto& m : chunks_) m->set_dropout_step(step);
  StepResult r = pipeline_step_ ? pipeline_step_->run(micro, gate) : step_->run(micro, gate);
  if (fp8_) fp8_->end_step(tp_, dp_);
  return r;
}

std::vector<double> TrainEngine::evaluate(const Batch& host) {
  const Batch b = on_compute_device(host);
  AutocastGuard autocast(precision_);
  if (exec_) return {exec_->evaluate({b}), (b.targets >= 0).sum().item<double>()};
  at::NoGradGuard no_grad;
  std::vector<double> metrics(objective_->metrics().size(), 0.0);
  std::vector<double> out{objective_->loss(*chunks_[0], b, false, metrics).item<double>(), objective_->units(b)};
  out.insert(out.end(), metrics.begin(), metrics.end());
  return out;
}

at::Tensor TrainEngine::row_losses(const Batch& host) {
  const Batch b = on_compute_device(host);
  AutocastGuard autocast(precision_);
  if (exec_) return exec_->row_losses(b);
  at::NoGradGuard no_grad;
  return chunks_[0]->forward(b.tokens, b.targets, false, b.doc_ids).sum(0).to(at::kDouble);  // [s, b] -> [b]
}

std::vector<ckpt::Piece> TrainEngine::pieces(bool trained_only) {
  std::vector<ckpt::Piece> out;
  size_t k = 0;  // this chunk's first entry in the optimizer's lists
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Transformer& m = *chunks_[c];
    std::vector<ckpt::Piece> p;
    if (!zero_.empty()) {
      // Each rank's own slices, as boxes of the parameters: nothing gathered.
      p = zero_pieces(m, zero_slices(c, k, true), dp_.rank());
    } else {
      size_t k2 = k;
      const std::vector<at::Tensor> ms = aligned(opt_->exp_avg(), m, k), vs = aligned(opt_->exp_avg_sq(), m, k2);
      p = training_pieces(m, ms, vs, dp_.rank(), expert_dp_.rank(), dp_.size(), expert_dp_.size());
    }
    if (trained_only) {
      for (const auto& param : m.params().params()) {
        if (!param.frozen) continue;
        p.erase(std::remove_if(p.begin(), p.end(), [&](const ckpt::Piece& x) { return x.name == "model/" + param.name; }),
                p.end());
      }
    }
    out.insert(out.end(), p.begin(), p.end());
  }
  if (fp8_) {
    std::vector<ckpt::Piece> p = fp8_->pieces(dp_.rank() == 0 && tp_.rank() == 0);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

ZeroSlices TrainEngine::zero_slices(size_t chunk, size_t& k, bool weights) {
  ShardedDataParallel& z = *zero_[chunk];
  const size_t n = z.shard_params().size();
  ZeroSlices out;
  out.ranges = z.owned_ranges();
  if (weights) {
    for (const auto& p : z.shard_params()) out.weights.push_back(p.tensor.detach());
  }
  out.exp_avg = slice(opt_->exp_avg(), k, n);
  out.exp_avg_sq = slice(opt_->exp_avg_sq(), k, n);
  out.replica_lead = shard_groups_.replicate->rank() == 0;
  k += n;
  return out;
}

void TrainEngine::load_weights(ckpt::Reader& r) {
  const auto& m = r.manifest();
  const bool merge = m.contains("lora") && m["lora"].is_object();
  size_t k = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Transformer& model = *chunks_[c];
    if (zero_.empty() || !zero_[c]->slices_hold_the_weights()) {
      load_initial_weights(r, model);  // stages 1 and 2 hold whole parameters (the slices are views of them)
      if (!zero_.empty()) zero_[c]->weights_changed();
    } else if (!merge) {
      ZeroSlices z = zero_slices(c, k, true);
      z.exp_avg.clear();  // a new optimizer
      z.exp_avg_sq.clear();
      load_zero_slices(r, model, z);
      zero_[c]->slices_loaded();
    } else {  // a LoRA merge needs the whole base weight and adapters: gathered once, at init
      std::vector<at::Tensor> w = current_params(model);
      load_initial_weights(r, model, w);
      zero_[c]->load_weights(w);
    }
  }
}

void TrainEngine::load_reference(ckpt::Reader& r) {
  if (reference_) load_initial_weights(r, *reference_);
}

int64_t TrainEngine::quantize_base() {
  int64_t bytes = 0;
  for (auto& m : chunks_) bytes += meshtrain::quantize_base(*m, QloraOptions{64, c_.lora_double_quant});
  return bytes;
}

int64_t TrainEngine::load(ckpt::Reader& r) {
  size_t k = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Transformer& m = *chunks_[c];
    if (!zero_.empty()) {
      // Straight into this rank's slices (stages 1 and 2 hold whole parameters: read whole, in place;
      // with bf16 parameters the slices are the fp32 weights: read into them, then gathered).
      ShardedDataParallel& z = *zero_[c];
      const bool into_slices = z.slices_hold_the_weights();
      if (!into_slices) load_model(r, m);
      load_zero_slices(r, m, zero_slices(c, k, into_slices));
      if (into_slices) z.slices_loaded();
      else z.weights_changed();  // offload: the host masters follow what was read
    } else {
      load_model(r, m);
      size_t k2 = k;
      std::vector<at::Tensor> ms = aligned(opt_->exp_avg(), m, k), vs = aligned(opt_->exp_avg_sq(), m, k2);
      load_moments(r, m, ms, vs);
    }
  }
  if (fp8_) fp8_->load(r);
  const int64_t steps = r.manifest().at("optimizer").at("steps").get<int64_t>();
  opt_->set_steps(steps);
  return steps;
}

std::vector<Param> TrainEngine::model_params() {
  std::vector<Transformer*> chunks;
  for (auto& m : chunks_) chunks.push_back(m.get());
  return pipeline_params(chunks);
}

int64_t TrainEngine::local_params() const {
  int64_t n = 0;
  for (const auto& m : chunks_) n += m->params().local_numel();
  return n;
}

MemoryUse TrainEngine::measure() {
  std::vector<Param> params;
  for (auto& m : chunks_) {
    for (const auto& p : m->params().params()) params.push_back(p);
  }
  std::vector<ShardedDataParallel*> zero;
  for (auto& z : zero_) zero.push_back(z.get());
  MemoryUse use = measure_memory(params, *opt_, ddp_.get(), zero);
  for (auto& m : chunks_) use.quantized += quantized_bytes(*m);
  return use;
}

std::string TrainEngine::memory_report(int dp_size, const std::string& precision) {
  const bool zero = !zero_.empty();
  const std::string mode = zero ? fmt::format("ZeRO-{}", c_.zero) : ddp_ ? "DDP" : "one replica";
  return memory_table(local_params(), zero ? zero_[0]->shard_group().size() : dp_size, measure(),
                      fmt::format("{} {}", mode, precision));
}

std::vector<plan::StageRange> TrainEngine::stage_layers() const {
  std::vector<plan::StageRange> out;
  for (const auto& m : chunks_) out.push_back({m->part().first, m->part().last, 0});
  return out;
}

double TrainEngine::moe_remote_rows() const {
  double rows = 0, calls = 0;
  for (const auto& m : chunks_) {
    for (const MoeLayer* l : m->moe_layers()) {
      rows += static_cast<double>(l->exchanges().rows_forward);
      calls += static_cast<double>(l->exchanges().forwards);
    }
  }
  return calls > 0 ? rows / calls : -1;
}

std::map<std::string, std::vector<Comm*>> TrainEngine::groups() {
  std::map<std::string, std::vector<Comm*>> g{
      {"tp", {&tp_}}, {"cp", {&cp_}}, {"pp", {&pp_}}, {"dp", {&dp_}}, {"embedding", {}}, {"ep", {&ep_}}};
  if (ep_.size() > 1) g["dp"].push_back(&expert_dp_);
  if (shard_groups_.shard) g["dp"].push_back(shard_groups_.shard.get());
  if (shard_groups_.replicate) g["dp"].push_back(shard_groups_.replicate.get());
  if (embed_) g["embedding"].push_back(embed_.get());
  return g;
}

std::map<std::string, double> TrainEngine::blocked_seconds() {
  std::map<std::string, double> out;
  for (const auto& [axis, groups] : groups()) {
    double s = 0;
    for (const Comm* g : groups) s += g->size() > 1 ? g->blocked_seconds() : 0.0;  // one rank: nothing to wait for
    out[axis] = s;
  }
  return out;
}

std::pair<double, double> TrainEngine::bubble() const {
  if (!exec_) return {0, 0};
  return {exec_->last_wait_seconds(), predicted_bubble_};
}

}  // namespace meshtrain
