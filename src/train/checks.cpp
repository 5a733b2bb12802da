// The checks of a run (train/trainer.h): before any rank starts (check_run),
// and the planner against the runtime after the first step (check_plan).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/validation.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/train/choice_eval.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/plan/count.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/train/memory_estimate.h"
#include "meshtrain/plan/posttrain.h"
#include "meshtrain/plan/strategy.h"
#include "meshtrain/plan/traffic.h"
#include "meshtrain/comm/transport_env.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/method.h"
#include "meshtrain/train/precision.h"
#include "meshtrain/train/state.h"
#include "meshtrain/train/run_strategy.h"
#include "meshtrain/train/run_checkpoints.h"
#include "meshtrain/train/trainer.h"
#include "meshtrain/train/step.h"
#include "train/checks.h"

namespace meshtrain {
namespace {

uint32_t max_token(const std::vector<std::string>& shards) {
  uint32_t m = 0;
  for (const auto& s : shards) {
    ShardReader r(s);
    for (uint64_t i = 0; i < r.size(); ++i) m = std::max(m, r[i]);
  }
  return m;
}

// The planner's name for a run's LoRA targets: "qv" (the default) or "all".
std::string plan_lora_targets(const LoraOptions& o) {
  if (o.targets == std::vector<std::string>{"attn.q", "attn.v"}) return "qv";
  if (o.targets.empty() || o.targets == std::vector<std::string>{"all"}) return "all";
  throw std::invalid_argument(fmt::format("--check-plan with LoRA compares lora.targets [\"attn.q\", \"attn.v\"] or "
                                          "[\"all\"] (the planner's qv and all), not [{}]",
                                          fmt::join(o.targets, ", ")));
}

}  // namespace

// --check-plan: the planner's bytes for this rank (plan/traffic.h, and the
// fp32 model states of plan/memory.h) beside what the runtime measured in the
// first step (traffic, in fp32 runs: the bytes the algorithms that ran moved,
// counted where they move them: comm.h's moved_bytes; fp8 runs: the e4m3 weight
// copies too); throws when one differs by more than 5%.
void check_plan(const TrainConfig& c, TrainEngine& engine, const std::map<std::string, double>& comm, int dp,
                int pp_rank, bool print) {
  const plan::Strategy s = strategy_of(c, dp);
  const plan::RankTraffic t =
      plan::rank_traffic(c.model, s, pp_rank, engine.stage_layers(), engine.moe_remote_rows());
  const MemoryUse mu = engine.measure();
  std::vector<std::pair<std::string, std::pair<double, double>>> rows;
  double dp_bytes = t.dp;
  if (c.lora.rank > 0) {
    // Adapter fine-tuning (plan/posttrain.h): a frozen base, the adapters' states,
    // and gradients reduced for the adapters only.
    const plan::LoraOptions lo{c.lora.rank, plan_lora_targets(c.lora), c.lora_quantize == "nf4", c.lora_double_quant};
    const plan::LoraStates ls = plan::lora_state_bytes(c.model, s, lo, 128 * c.tp);
    rows = {{c.lora_quantize == "nf4" ? "frozen base (NF4 linears)" : "frozen base",
             {ls.base, static_cast<double>(mu.frozen + mu.quantized)}},
            {"adapters", {ls.adapters.params, static_cast<double>(mu.params - mu.frozen)}},
            {"gradients", {ls.adapters.grads, static_cast<double>(mu.grads)}},
            {"optimizer states", {ls.adapters.optimizer, static_cast<double>(mu.optimizer)}}};
    dp_bytes = t.dp * static_cast<double>(plan::lora_params(c.model, lo)) / (t.params * c.tp * c.pp);
  } else {
    // Dense states shard over the data-parallel replicas (dp x ep) x cp, the experts' over dp x cp.
    const int shard = c.dp_shard > 0 ? c.dp_shard : dp * c.cp;
    const plan::ModelStates ms =
        plan::model_state_bytes(t.params - t.expert_params, plan::Precision::Fp32, c.zero, shard);
    const plan::ModelStates me =
        plan::model_state_bytes(t.expert_params, plan::Precision::Fp32, c.zero, std::max(1, shard / c.ep));
    rows = {{"parameters", {ms.params + me.params, static_cast<double>(mu.params)}},
            {"gradients", {ms.grads + me.grads, static_cast<double>(mu.grads)}},
            {"optimizer states", {ms.optimizer + me.optimizer, static_cast<double>(mu.optimizer)}}};
    if (c.offload) {
      // ZeRO-Offload (parallel/data/zero.h): the moments leave the device; the host holds them with an
      // fp32 master slice and a gradient slice, 4 B each per owned parameter (ZeRO-3's shard size).
      const double owned = plan::model_state_bytes(t.params - t.expert_params, plan::Precision::Fp32, 3, shard).params +
                           plan::model_state_bytes(t.expert_params, plan::Precision::Fp32, 3, std::max(1, shard / c.ep)).params;
      rows[2].second.first = 0;
      if (c.zero_param_dtype == "bf16") {
        // 16-bit weights on the device (zero.h): 2 B per parameter, and stage 1's whole gradients bf16 too
        // (stage 2 keeps its reduced slice in fp32).
        using plan::Precision;
        const auto bytes = [&](Precision p) {
          return plan::model_state_bytes(t.params - t.expert_params, p, c.zero, shard);
        };
        rows[0].second.first = bytes(Precision::Bf16).params;
        rows[1].second.first = bytes(c.zero == 1 ? Precision::Bf16 : Precision::Fp32).grads;
      }
      rows.push_back({"host: master, gradient, moments", {2 * owned + ms.optimizer + me.optimizer,
                                                          static_cast<double>(mu.host)}});
    }
  }
  if (engine.fp8()) {
    // FP8 (plan/memory.h's "fp8 weight copies"): one byte for each weight of this rank's block
    // linears, quantised whole (ZeRO-3 gathers first) for each micro-batch's backward.
    const plan::ParamCount pc = plan::count_params(c.model);
    double linear = 0;
    for (const plan::StageRange& r : engine.stage_layers()) {
      for (int64_t i = r.first; i < r.last; ++i) linear += static_cast<double>(pc.of(c.model, i).tp_sharded) / c.tp;
    }
    rows.push_back({"fp8 weight copies", {linear, static_cast<double>(engine.fp8()->weight_copy_bytes())}});
  }
  const std::pair<const char*, std::pair<double, double>> traffic[] = {
      {"tp bytes moved", {t.tp, comm.at("tp")}},
      {"cp bytes moved", {t.cp, comm.at("cp")}},
      {"dp bytes moved", {dp_bytes, comm.at("dp")}},
      {"pp bytes moved", {t.pp, comm.at("pp")}},
      {"tied-embedding bytes moved", {t.embedding, comm.at("embedding")}},
      {"ep bytes moved", {t.ep, comm.at("ep")}}};
  // Traffic in fp32 runs only: under autocast (bf16, fp8) an activation's dtype changes op by op, and
  // with it the bytes a collective moves; the planner counts 16-bit activations throughout.
  const bool compare_traffic = c.precision == "fp32";
  if (compare_traffic) {
    for (const auto& [name, v] : traffic) rows.push_back({name, v});
  }
  std::string table = fmt::format("check-plan, pipeline stage {} ({} parameters on this rank by the plan, {} measured):\n",
                                  pp_rank, t.params, engine.local_params());
  table += fmt::format("  {:<28} {:>14} {:>14} {:>8}\n", "per rank, one step", "plan", "measured", "ratio");
  std::vector<std::string> off;
  for (const auto& [name, v] : rows) {
    const auto [predicted, measured] = v;
    const double ratio = predicted > 0 ? measured / predicted : (measured > 0 ? INFINITY : 1.0);
    table += fmt::format("  {:<28} {:>14} {:>14} {:>8.4f}\n", name, plan::human_bytes(predicted),
                         plan::human_bytes(measured), ratio);
    if (std::abs(measured - predicted) > 0.05 * std::max(predicted, measured) && std::max(predicted, measured) > 0) {
      off.push_back(fmt::format("{} (plan {}, measured {})", name, predicted, measured));
    }
  }
  if (!compare_traffic) table += fmt::format("  (bytes moved: compared in fp32 runs only; this one is {})\n", c.precision);
  if (print) fmt::print("{}", table);
  if (!off.empty()) {
    throw std::runtime_error(fmt::format("--check-plan: the runtime differs from the plan by more than 5% on pipeline "
                                         "stage {}: {}",
                                         pp_rank, fmt::join(off, "; ")));
  }
}

// What can be checked from the config and the data before any rank starts
// work (run in the launching process, and again by a rank started by another
// launcher): the mesh fits the world, the batch divides over data-parallel
// ranks, token ids fit the vocabulary, the training and validation shards
// hold a global batch of windows. Each failure is one error naming the value.
// With `warn_memory`, also prints a warning when the planner's per-rank
// estimate times the ranks on this host exceeds its free memory.
namespace {

// What every rank would otherwise find only after it started (once per rank, the checkpoint
// directory already locked): the transport switches, an explicit resume path, a metrics path.
void check_start_paths(const TrainConfig& c) {
  check_transport_variables();
  if (c.resume != "auto" && c.resume != "none") {
    try {
      ckpt::resolve(c.resume);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("checkpoint.resume = \"{}\": {} (use \"auto\", \"none\" or a checkpoint "
                                              "step or run directory)",
                                              c.resume, e.what()));
    }
  }
  if (!c.metrics.empty()) {
    namespace fs = std::filesystem;
    const fs::path file(c.metrics);
    std::error_code ec;
    if (fs::is_directory(file, ec)) {
      throw std::invalid_argument(fmt::format("train.metrics = {} is a directory; name a file", c.metrics));
    }
    // The nearest existing ancestor must be a writable directory (the trainer creates the rest).
    fs::path dir = fs::absolute(file, ec).parent_path();
    while (!fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0) {
      throw std::invalid_argument(fmt::format("train.metrics = {}: {} is not a writable directory; choose another path",
                                              c.metrics, dir.string()));
    }
  }
}

}  // namespace

void check_cuda_run(const TrainConfig& c) {
  std::string what;
  if (c.method != "pretrain" && c.method != "sft") what = fmt::format("train.method = \"{}\"", c.method);
  else if (c.model.experts > 0) what = fmt::format("model.experts = {} (MoE)", c.model.experts);
  else if (c.cp > 1) what = fmt::format("parallel.cp = {}", c.cp);
  else if (c.pp > 1) what = fmt::format("parallel.pp = {}", c.pp);
  else if (c.model.attention == plan::AttentionImpl::Tiled) what = "model.attention = \"tiled\" (a CPU kernel)";
  else if (c.document_mask) what = "train.document_mask = true (needs the tiled CPU kernel)";
  else if (c.lora.rank > 0 || c.adapters.bottleneck > 0) what = "LoRA/QLoRA/adapters";
  if (what.empty() && c.precision == "fp8") {
    // CUDA's FP8 GEMM (cuBLASLt through at::_scaled_mm) takes sizes that are multiples of 16: every
    // linear's in and out features on this rank and its rows (tokens of a micro-batch).
    const plan::ModelSpec& m = c.model;
    const int64_t d = m.head_dim();
    const std::vector<std::pair<const char*, int64_t>> sizes{
        {"model.hidden", m.hidden}, {"model.ffn / tp", m.ffn / c.tp}, {"model.heads x head_dim / tp", m.heads * d / c.tp},
        {"model.kv_heads x head_dim / tp", m.kv_heads * d / c.tp}, {"train.micro_batch x train.seq", c.micro_batch * c.seq}};
    for (const auto& [name, v] : sizes) {
      if (v % 16 != 0) {
        throw std::invalid_argument(fmt::format("train.precision = \"fp8\" on cuda: {} is {}, and CUDA's FP8 GEMM "
                                                "needs multiples of 16; change it or use train.precision = \"bf16\"",
                                                name, v));
      }
    }
  }
  if (what.empty()) return;
  throw std::invalid_argument(fmt::format(
      "train.device = cuda: {} runs on cpu only for now (CUDA runs: pretrain and sft of dense models, dp/ZeRO/tp); "
      "use train.device = \"cpu\"",
      what));
}

BackendKind bind_run_device(const TrainConfig& c, int local_rank, int local_world_size) {
  const DeviceKind device =
      resolve_device(parse_device(c.device), cuda_device_count(), local_world_size, c.comm_backend == "gloo");
  bind_compute_device(device, local_rank);
  return device == DeviceKind::Cuda && c.comm_backend != "gloo" ? BackendKind::Nccl : BackendKind::Gloo;
}

void measure_host_before_ranks(const TrainConfig& c) {
  if (c.peak_tflops > 0) return;
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string what = c.precision == "bf16" || c.precision == "fp8" ? "gemm_bf16" : "gemm_fp32";
  const HostPeak p = measure_host_peak(what, cores);
  for (const std::string& w : p.warnings) fmt::print(stderr, "meshtrain: warning: {}\n", w);
  hand_down_host_peak(what, p, cores);
}

DeviceKind check_run(const TrainConfig& c, int world, int ranks_per_node, bool plan_check, bool warn_memory) {
  const auto layout = MeshLayout::create(world, {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"ep", c.ep}});
  const DeviceKind device =
      resolve_device(parse_device(c.device), cuda_device_count(), ranks_per_node, c.comm_backend == "gloo");
  if (device == DeviceKind::Cpu && c.comm_backend == "nccl") {
    throw std::invalid_argument("comm.backend = \"nccl\" carries CUDA tensors: it needs train.device = \"cuda\" "
                                "(this run computes on cpu); use comm.backend = \"auto\" or \"gloo\"");
  }
  if (device == DeviceKind::Cuda) check_cuda_run(c);
  if (device == DeviceKind::Cpu && c.offload) {
    throw std::invalid_argument("parallel.offload moves optimizer states from a GPU to host memory, and this run "
                                "computes on cpu, where they are in host memory already: remove parallel.offload "
                                "(or train.device = \"cuda\" on a machine with a GPU)");
  }
  check_start_paths(c);
  const int dp = layout.size("dp") * layout.size("ep");  // the replicas reading different data
  const Method& method = method_named(c.method);
  if (method.check_start) method.check_start(c, dp);
  if (!method.token_data) return device;
  if (!c.eval_tasks.empty()) {
    if (c.method != "pretrain" && c.method != "sft") {
      throw std::invalid_argument(fmt::format("eval.tasks score next-token log-likelihoods: train.method \"{}\" has "
                                              "another objective (use pretrain or sft, or remove eval.tasks)",
                                              c.method));
    }
    const std::string tokenizer = run_tokenizer(c.eval_tokenizer, train_shards_of(c));
    std::map<std::string, std::string> names;  // a task's name keys its metrics
    for (const auto& t : c.eval_tasks) {
      // Errors name the file and line; then its ids must fit the model (the tokenizer is the model's).
      check_choice_ids(tokenize_choice_task(t, tokenizer), c.model.vocab, t);
      const auto [it, fresh] = names.emplace(choice_task_name(t), t);
      if (!fresh) {
        throw std::invalid_argument(fmt::format("eval.tasks: {} and {} have the same name \"{}\" (their metrics "
                                                "would collide); rename one", it->second, t, it->first));
      }
    }
  }
  if (c.global_batch % (c.micro_batch * dp) != 0) {
    throw std::invalid_argument(fmt::format("train.global_batch {} is not divisible by micro_batch {} x dp {}{}",
                                            c.global_batch, c.micro_batch, dp,
                                            c.ep > 1 ? fmt::format(" (dp {} x ep {})", dp / c.ep, c.ep) : ""));
  }
  std::vector<std::string> shard_list = train_shards_of(c);  // every shard read: trained, validated, each source's
  shard_list.insert(shard_list.end(), c.val_shards.begin(), c.val_shards.end());
  for (const auto& src : c.sources) shard_list.insert(shard_list.end(), src.val.begin(), src.val.end());
  for (const auto& shard : shard_list) {  // an id >= vocab would index past the embedding (or, split over tp, be lost)
    const uint32_t top = max_token({shard});
    if (top >= c.model.vocab) {
      throw std::invalid_argument(fmt::format("model.vocab {} is smaller than token id {} in {}; set model.vocab "
                                              "to the tokenizer's size",
                                              c.model.vocab, top, shard));
    }
  }
  if (!method.packed_info.empty()) {
    // Blocks packed for another length would cut conversations: the data's sft.json (dpo.json) names its seq.
    std::vector<std::string> shards = train_shards_of(c);
    shards.insert(shards.end(), c.val_shards.begin(), c.val_shards.end());
    for (const auto& shard : shards) {
      const auto info = std::filesystem::path(shard).parent_path() / method.packed_info;
      if (!std::filesystem::exists(TokenLoader::mask_path(shard)) || !std::filesystem::exists(info)) {
        throw std::invalid_argument(fmt::format("train.method = \"{}\" needs {} and {} beside {}: make them with "
                                                "meshtrain tokenize {}",
                                                c.method, TokenLoader::mask_path(shard), info.string(), shard,
                                                method.tokenize));
      }
      nlohmann::json j;
      std::ifstream(info) >> j;
      if (j.value("seq", int64_t{0}) != c.seq) {
        throw std::invalid_argument(fmt::format("{} was packed into blocks of {} tokens but train.seq = {}: set "
                                                "train.seq = {} or re-run meshtrain tokenize {} --seq {}",
                                                shard, j.value("seq", int64_t{0}), c.seq, j.value("seq", int64_t{0}),
                                                method.tokenize, c.seq));
      }
    }
  }
  train_loader(c, 0, dp);
  for (const auto& src : c.sources) {
    if (src.val.empty()) continue;
    try {
      ValidationSet(src.val, c.seq, c.micro_batch, c.seed, loader_options(c), static_cast<uint64_t>(c.eval_windows), 0,
                    dp);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("data.sources ({}) val: {}", src.name, e.what()));
    }
  }
  if (!c.val_shards.empty()) {
    try {
      ValidationSet(c.val_shards, c.seq, c.micro_batch, c.seed, loader_options(c),
                    static_cast<uint64_t>(c.eval_windows), 0, dp);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("data.val: {} (or drop data.val: --set data.val=[])", e.what()));
    }
  }
  if (plan_check && c.lora.rank > 0) plan_lora_targets(c.lora);
  if (plan_check && c.adapters.bottleneck > 0) {
    throw std::invalid_argument("--check-plan has no planner ledger for bottleneck adapters yet; drop --check-plan");
  }
  if (plan_check && c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp8") {
    throw std::invalid_argument(fmt::format("--check-plan compares fp32, bf16 and fp8 runs (train.precision is "
                                            "\"{}\"); drop --check-plan or set train.precision",
                                            c.precision));
  }
  if (!c.init_from.empty()) {
    try {
      const ckpt::Reader r(ckpt::resolve(c.init_from));
      check_same_model(r, c.model);
      namespace fs = std::filesystem;
      if (!c.ckpt_dir.empty() && fs::exists(c.ckpt_dir) &&
          fs::equivalent(fs::path(r.dir()).parent_path(), c.ckpt_dir)) {
        throw std::invalid_argument(fmt::format("it lies in this run's checkpoint.dir = \"{}\", whose steps rotate "
                                                "(keep = {}) and would delete it; train into another directory",
                                                c.ckpt_dir, c.ckpt_keep));
      }
      // LoRA adapters merge into the weights (train/state.h); bottleneck adapters cannot.
      for (const auto& [name, t] : r.manifest()["tensors"].items()) {
        if (name.find(".adapter_") != std::string::npos && c.adapters.bottleneck == 0) {
          throw std::invalid_argument(fmt::format("it holds bottleneck adapters ({}), which cannot be merged into the "
                                                  "weights; train on with the same [adapters] bottleneck",
                                                  name));
        }
      }
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("init.from = \"{}\": {}", c.init_from, e.what()));
    }
    // The checkpoint a resume would load holds the pinned starting weights: moved or changed is one error here.
    std::string resumed;
    if (c.resume == "auto" && !c.ckpt_dir.empty()) resumed = ckpt::latest(c.ckpt_dir).value_or("");
    if (c.resume != "auto" && c.resume != "none") resumed = ckpt::resolve(c.resume);
    if (!resumed.empty()) {
      try {
        starting_weights(c, resumed);
      } catch (const std::runtime_error& e) {
        throw std::invalid_argument(e.what());
      }
    }
  }
  if (!warn_memory) return device;
  // The planner's estimate against this host's memory: a warning, not an error (it is an estimate).
  // On the CPU: the trainer's estimate (train/memory_estimate.h), with this process's resident size standing in
  // for a rank's at its start (the same binary and libraries, loaded); on a GPU the plan's device ledger.
  const double per_rank =
      device == DeviceKind::Cpu
          ? estimate_memory(c, dp, resident_bytes(), file_resident_bytes(), 0).total()
          : plan::memory_ledger(c.model, strategy_of(c, dp), plan::MemoryOptions{0, 0}).peak().device_total();
  const double available = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const int local = ranks_per_node;  // the ranks of this launch on this host
  if (warn_memory && per_rank * local > available) {
    fmt::print(stderr, "warning: the plan estimates {} per rank ({} attention), {} for this host's {} rank(s), and {} "
                       "is free: expect the out-of-memory killer (model.attention = \"tiled\", parallel.cp, "
                       "train.recompute or a smaller micro_batch lower it)\n",
               plan::human_bytes(per_rank), plan::attention_name(c.model.attention),
               plan::human_bytes(per_rank * local), local, plan::human_bytes(available));
  }
  return device;
}

}  // namespace meshtrain
