// The training loop of `meshtrain train` (train/trainer.h).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "meshtrain/comm/transport_env.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/validation.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/parallel/context/zigzag.h"
#include "meshtrain/plan/count.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/plan/posttrain.h"
#include "meshtrain/plan/strategy.h"
#include "meshtrain/plan/traffic.h"
#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/choice_eval.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/train/exposed_comm.h"
#include "meshtrain/train/progress.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/platform/tensor_memory.h"
#include "meshtrain/train/memory_estimate.h"
#include "meshtrain/train/method.h"
#include "meshtrain/train/precision.h"
#include "meshtrain/train/state.h"
#include "meshtrain/train/run_checkpoints.h"
#include "meshtrain/train/run_strategy.h"
#include "meshtrain/train/trainer.h"

#include "meshtrain/comm/autograd.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/train/step.h"
#include "meshtrain/train/replica_check.h"
#include "meshtrain/platform/fault.h"
#include "train/checks.h"
#include "train/spike_defence.h"

namespace meshtrain {
namespace {

// Validation over `dp` (the data-parallel x cp group): the same windows on
// every mesh (data/validation.h), split by data-parallel replica (`data`),
// each cp rank taking its chunks. Returns the mean loss, then the
// objective's metrics, per unit.
std::vector<double> evaluate(TrainEngine& engine, const TrainConfig& c, Comm& dp, Comm& data, const ZigZag& chunks,
                             const std::vector<std::string>& shards) {
  ValidationSet val(shards, c.seq, c.micro_batch, c.seed, loader_options(c), static_cast<uint64_t>(c.eval_windows),
                    data.rank(), data.size());
  at::Tensor sums;
  for (uint64_t k = 0; k < val.calls(); ++k) {
    const at::Tensor one = at::tensor(engine.evaluate(context_shard(val.batch(k), chunks)), at::kDouble);
    sums = sums.defined() ? sums + one : one;
  }
  dp.all_reduce(sums);
  std::vector<double> out;
  for (int64_t i = 0; i < sums.size(0); ++i) {
    if (i != 1) out.push_back(sums[i].item<double>() / sums[1].item<double>());
  }
  return out;
}

// A multiple-choice task (train/choice_eval.h) over the mesh: each
// data-parallel replica scores its share of the choices, micro_batch rows per
// forward (every rank runs the same number of forwards: the last ones padded
// with rows that score nothing); the rows' losses are summed over `dp` (dp x
// cp: a cp rank's cover its chunks), so every rank judges every question.
ChoiceScore evaluate_choices(TrainEngine& engine, const TrainConfig& c, Comm& dp, Comm& data, const ZigZag& chunks,
                             const std::vector<TokenizedChoice>& qs) {
  const auto index = choice_rows(qs);
  const int64_t rows = c.micro_batch, total = static_cast<int64_t>(index.size());
  const int64_t calls = (total + rows * data.size() - 1) / (rows * data.size());
  at::Tensor nll = at::zeros({total}, at::kDouble);
  for (int64_t call = 0; call < calls; ++call) {
    const int64_t first = std::min(total, (call * data.size() + data.rank()) * rows), end = std::min(total, first + rows);
    Batch b;
    b.tokens = at::zeros({rows, c.seq}, at::kLong);
    b.targets = at::full({rows, c.seq}, -1, at::kLong);
    if (c.document_mask) b.doc_ids = at::zeros({rows, c.seq}, at::kLong);
    rows_from(qs, index, static_cast<size_t>(first), static_cast<size_t>(end), c.seq, b.tokens.data_ptr<int64_t>(),
              b.targets.data_ptr<int64_t>());
    const at::Tensor losses = engine.row_losses(context_shard(b, chunks)).contiguous();
    if (end > first) nll.narrow(0, first, end - first).copy_(losses.narrow(0, 0, end - first));
  }
  dp.all_reduce(nll);
  return score_rows(qs, std::vector<double>(nll.data_ptr<double>(), nll.data_ptr<double>() + total));
}

// " | name value" for each of a method's metrics.
std::string metrics_text(const std::vector<std::string>& names, const std::vector<double>& values) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += fmt::format(" | {} {:.4f}", names[i], values.at(i));
  return out;
}

}  // namespace

int train(const TrainConfig& c, Runtime& runtime, bool plan_check) {
  if (const Method& method = method_named(c.method); method.run) return method.run(c, runtime);
  tensor_memory::install();
  Runtime* rt = &runtime;
  // Also checked before launching (a foreign launcher skips that); one process warns here.
  const DeviceKind device =
      check_run(c, rt->world_size(), rt->env().local_world_size, plan_check, rt->world_size() == 1);
  auto layout = MeshLayout::create(rt->world_size(), {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"ep", c.ep}});
  DeviceMesh mesh(*rt, layout, mesh_groups(c));
  // Gradients and the loss normaliser are summed over dp x cp (x ep); windows
  // are read per data-parallel replica (`data`: dp, x ep with expert
  // parallelism), and each cp rank of a replica takes its zig-zag chunks of them.
  Comm& dp = dense_group(c, mesh);
  Comm& data = data_group(c, mesh);
  const ZigZag chunks(c.seq, c.cp, mesh.coord("cp"));
  const bool lead = rt->rank() == 0;
  const int64_t accumulation = c.global_batch / (c.micro_batch * data.size());
  if (lead) fmt::print("{}{}\n", layout.table(rt->env().local_world_size), transport_variables());
  if (lead) {
    fmt::print("device {} (train.device = \"{}\"; {})\n", to_string(device), c.device,
               cuda_loaded() ? fmt::format("{} CUDA device(s) visible", cuda_device_count()) : cuda_absence_reason());
  }
  // The memory estimate's start point (on the CPU): resident bytes before the engine allocates anything,
  // then the first GEMMs' workspace measured right after it (train/memory_estimate.h).
  std::optional<MemoryEstimate> mem_estimate;
  if (!computes_on_cuda()) {
    const double at_start = resident_bytes();
    const double files_at_start = file_resident_bytes();
    mem_estimate = estimate_memory(c, data.size(), at_start, files_at_start, measure_gemm_workspace(c));
  }
  TrainEngine engine(c, *rt, mesh, accumulation, lead);
  TokenLoader loader = train_loader(c, data.rank(), data.size());
  std::vector<std::pair<std::string, std::vector<TokenizedChoice>>> tasks;  // [eval] tasks, tokenized on every rank
  if (!c.eval_tasks.empty()) {
    const std::string tokenizer = run_tokenizer(c.eval_tokenizer, train_shards_of(c));
    for (const auto& t : c.eval_tasks) {
      tasks.emplace_back(choice_task_name(t), tokenize_choice_task(t, tokenizer));
      check_choice_ids(tasks.back().second, c.model.vocab, t);
    }
  }
  // Model FLOPs per token: adapter runs compute no weight gradients of their frozen base (plan/count.h).
  const double flops_per_token =
      c.lora.rank > 0 ? plan::adapter_train_flops_per_token(
                            c.model, c.seq, plan::lora_params_matching(c.model, c.lora.rank, c.lora.targets))
                      : plan::train_flops_per_token(c.model, c.seq);
  const HostPeak peak = lead ? mfu_peak(c.peak_tflops, c.precision == "bf16" || c.precision == "fp8") : HostPeak{};
  const int nodes = std::max(1, mesh.world().size() / std::max(1, rt->env().local_world_size));
  const int units = computes_on_cuda() ? mesh.world().size() : nodes;
  const double peak_flops = peak.value * units;
  // The planner's exposed communication per axis, printed beside the measured (exposed_comm.h).
  std::map<std::string, double> planned_comm;
  if (lead && mesh.world().size() > 1) {
    try {
      const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      const double copy = computes_on_cuda() ? 0 : cached_copy_bandwidth(cores);
      const auto spec = run_device_spec(computes_on_cuda(), compute_device_name(), peak.value, copy,
                                        rt->env().local_world_size);
      if (spec && (computes_on_cuda() || copy > 0)) planned_comm = planned_exposed(c, data.size(), *spec);
      if (!computes_on_cuda() && copy <= 0) {
        fmt::print("the step log's exposed communication has no planned column: this host's copy bandwidth was never "
                   "measured (`meshtrain plan --gpu cpu` measures and caches it)\n");
      }
    } catch (const std::exception& e) {
      fmt::print("the planner does not model this run's communication ({}): the step log shows the measured only\n",
                 e.what());
    }
  }
  mesh.world().barrier();
  if (lead) {
    const plan::Strategy s = strategy_of(c, data.size());
    const auto mem = plan::memory_ledger(c.model, s, plan::MemoryOptions{0, 0});
    fmt::print("model {}: {} parameters ({} on this rank); estimated {} ({}, Adam)\n", c.model.name,
               plan::count_params(c.model, 128 * c.tp).total, engine.local_params(),
               mem_estimate ? mem_estimate->describe()
                            : plan::human_bytes(mem.peak().device_total()) + " per rank on the device (plan ledger)",
               c.precision);
    fmt::print("global batch {} x {} tokens = {} micro-batches of {} on {} data-parallel ranks x {} accumulation steps{}\n",
               c.global_batch, c.seq, c.global_batch / c.micro_batch, c.micro_batch, data.size(), accumulation,
               c.cp > 1 ? fmt::format("; each sequence over {} context-parallel ranks ({} attention, {} tokens each)",
                                      c.cp, c.cp_impl, c.seq / c.cp)
                        : "");
    fmt::print("MFU = {:.4g} FLOPs/token ({}) x tokens/s / ({} {} x {:.4g} GFLOP/s: {})\n", flops_per_token,
               c.lora.rank > 0 ? plan::adapter_flops_formula(plan::AttnFlops::Full)
                               : plan::flops_formula(plan::AttnFlops::Full),
               units, computes_on_cuda() ? "device(s)" : "host(s)", peak.value / 1e9, peak.source);
  }
  // The starting weights, then QLoRA's quantisation of them, then the
  // checkpoint (a QLoRA checkpoint holds no base linears: they are the [init]
  // weights quantised again, so a resumed run loads them first too).
  // The saver first: it takes the directory's lock and recovers what a crash left (an interrupted
  // re-save's only copy) before the newest checkpoint is looked for.
  std::unique_ptr<ckpt::Checkpointer> saver = checkpoint_saver(c, *rt);
  const std::string resumed = resume_path(c, mesh.world(), rt->env().restart);
  std::optional<ckpt::Pin> init;
  if (!c.init_from.empty()) {
    init = starting_weights(c, resumed);
    ckpt::Reader r(init->step_dir);
    if (resumed.empty() || adapter_checkpoints(c)) engine.load_weights(r);
    engine.load_reference(r);
    if (lead && resumed.empty()) {
      fmt::print("weights from {} (step {}; a new optimizer, step 0)\n", r.dir(), r.manifest().value("step", 0));
    }
  }
  if (c.lora_quantize != "none") {
    const int64_t bytes = engine.quantize_base();
    if (lead) {
      fmt::print("QLoRA: block linears in NF4 (block 64{}): {} on this rank\n",
                 c.lora_double_quant ? ", double-quantised scales" : "", plan::human_bytes(static_cast<double>(bytes)));
    }
  }
  SpikeDefence spike(c.spike, accumulation, static_cast<uint64_t>(c.micro_batch * data.size()));
  const int64_t start = resume_training(c, resumed, engine, loader, data.size(), mesh.world(), lead, spike, false);
  const int64_t last = c.stop_after > 0 ? std::min(c.stop_after, c.steps) : c.steps;
  int64_t newest = resumed.empty() ? -1 : start;  // the newest checkpoint's step: where a rollback goes
  auto save = [&](int64_t s) {
    if (!saver) return;
    const auto t0 = std::chrono::steady_clock::now();
    const PeakProbe probe;
    // Every pipeline stage writes its own layers under their global names.
    saver->save(s, engine.pieces(adapter_checkpoints(c)),
                training_checkpoint_fields(c, engine.optimizer(), loader, data.size(), engine.scaler(), spike,
                                           init ? &*init : nullptr),
                nlohmann::json::object());
    newest = s;
    spike.saved(s);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double extra = max_over(mesh.world(), probe.extra_bytes());
    if (lead) {
      fmt::print("step {:>5} | checkpoint {}/{} {} ({:.2f} s blocking, peak extra memory {} per rank)\n", s,
                 c.ckpt_dir, ckpt::step_dir_name(s),
                 c.ckpt_async ? "snapshot taken, writing in the background" : "saved", dt, plan::human_bytes(extra));
    }
  };
  std::ofstream metrics;
  if (lead && !c.metrics.empty()) {
    std::filesystem::path p(c.metrics);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    metrics.open(c.metrics, std::ios::app);
    if (!metrics) throw std::runtime_error(fmt::format("cannot write metrics file {}", c.metrics));
  }
  const auto run_t0 = std::chrono::steady_clock::now();
  for (int64_t s = start + 1; s <= last; ++s) {
    spike.begin_step(s, loader);
    set_fault_step(s);
    std::vector<Batch> micro;
    for (int64_t i = 0; i < accumulation; ++i) micro.push_back(context_shard(loader.next(), chunks));
    const bool checked = plan_check && s == start + 1;
    if (checked) {
      for (auto& [axis, groups] : engine.groups()) {
        for (Comm* g : groups) g->reset_stats();
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double a2a0 = all_to_all_rows_seconds();
    std::map<std::string, double> exposed = engine.blocked_seconds();
    StepResult r = engine.step(s, micro, spike.gate());
    for (auto& [axis, seconds] : engine.blocked_seconds()) exposed[axis] = seconds - exposed[axis];
    const double a2a = all_to_all_rows_seconds() - a2a0;  // this rank's MoE dispatch and combine
    if (fault_perturb_after(s)) {  // a test's silent corruption (platform/fault.h)
      at::NoGradGuard no_grad;
      engine.model_params().at(0).tensor.view({-1})[0].add_(1e-3);
    }
    if (c.check_replicas_every > 0 && s % c.check_replicas_every == 0) {
      // Each parameter over its own replicas: dense ones over dp (x cp x ep), experts over dp x cp
      // (the ep ranks hold other experts, by design).
      std::vector<Param> dense, experts;
      for (auto& p : engine.model_params()) (c.ep > 1 && p.expert ? experts : dense).push_back(p);
      auto bad = compare_replicas(dense, dp);
      if (c.ep > 1) {
        const auto off = compare_replicas(experts, mesh.group({"dp", "cp"}));
        bad.insert(bad.end(), off.begin(), off.end());
      }
      if (!bad.empty()) {
        throw std::runtime_error(fmt::format("after step {} the data-parallel replicas' parameters differ (silent "
                                             "data corruption: a faulty device or memory; resume from the newest "
                                             "checkpoint without the named ranks' hosts):\n{}",
                                             s, replica_report(bad)));
      }
    }
    nlohmann::json event;  // a loss spike's (train/spike.h)
    if (spike.spiked() && c.spike.policy == SpikePolicy::Rollback && newest >= 0) {
      event = spike.roll_back(s, r, newest);
      if (lead) {
        fmt::print("step {:>5} | {}\n", s, spike_line(event));
        if (metrics.is_open()) metrics << nlohmann::json{{"step", s}, {"spike", event}}.dump() << "\n" << std::flush;
      }
      if (saver) saver->finish();
      const std::string to = (std::filesystem::path(c.ckpt_dir) / ckpt::step_dir_name(newest)).string();
      s = resume_training(c, to, engine, loader, data.size(), mesh.world(), lead, spike, true);
      continue;
    }
    if (spike.spiked()) {
      const bool no_checkpoint = c.spike.policy == SpikePolicy::Rollback;
      event = spike.note(s, r, c.spike.policy == SpikePolicy::Log ? "trained on (policy log)"
                               : no_checkpoint ? "update dropped (no checkpoint yet to roll back to)"
                                               : "update dropped");
      if (lead) fmt::print("step {:>5} | {}\n", s, spike_line(event));
    }
    if (checked) {
      std::map<std::string, double> sent;
      for (auto& [axis, groups] : engine.groups()) {
        sent[axis] = 0;
        for (Comm* g : groups) {
          for (const auto& [op, st] : g->stats()) sent[axis] += static_cast<double>(st.moved_bytes);
        }
      }
      const auto coords = layout.coords(rt->rank());
      check_plan(c, engine, sent, data.size(), coords.at("pp"),
                 coords.at("tp") == 0 && coords.at("dp") == 0 && coords.at("cp") == 0);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // DPO's batch counts pairs: two sequences each.
    const double tokens_per_s = static_cast<double>(c.global_batch * c.seq * (pairwise(c.method) ? 2 : 1)) / dt;
    const double mfu = flops_per_token * tokens_per_s / peak_flops;
    const auto [wait, predicted] = engine.bubble();
    // Validation (when due) first, so the step's metrics line holds it too.
    std::vector<double> val;
    const bool eval_step = s % c.eval_every == 0 || s == last;
    if (!c.val_shards.empty() && eval_step) val = evaluate(engine, c, dp, data, chunks, c.val_shards);
    std::vector<std::pair<std::string, ChoiceScore>> scores;
    std::vector<std::pair<std::string, double>> source_val;  // a mixture's validation loss per source
    if (eval_step) {
      for (const auto& [name, qs] : tasks) scores.emplace_back(name, evaluate_choices(engine, c, dp, data, chunks, qs));
      for (const auto& src : c.sources) {
        if (!src.val.empty()) source_val.emplace_back(src.name, evaluate(engine, c, dp, data, chunks, src.val)[0]);
      }
    }
    const auto sources = loader.source_stats();
    const auto source_tokens = [&](const TokenLoader::SourceStats& src) {  // a unit is a window (DPO: a pair of two)
      return src.taken * static_cast<uint64_t>(c.seq) * (pairwise(c.method) ? 2 : 1);
    };
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_t0).count();
    if (lead) {
      if (s % c.log_every == 0 || s == start + 1 || s == last) {
        std::vector<std::string> names;
        std::vector<double> values;
        for (const auto& [name, value] : r.metrics) {
          names.push_back(name);
          values.push_back(value);
        }
        fmt::print("step {:>5} | loss {:.4f}{} | lr {:.2e} | grad norm {:.3f} | {:.0f} tokens/s | MFU {:.1f}% | peak mem {} "
                   "| {}{}\n",
                   s, r.loss, metrics_text(names, values), r.lr, r.grad_norm, tokens_per_s, 100 * mfu,
                   computes_on_cuda() ? fmt::format("{} on {}", plan::human_bytes(static_cast<double>(peak_device_bytes())),
                                                    compute_device().str())
                                      : plan::human_bytes(peak_rss_bytes()),
                   progress_text(elapsed, s - start, s, c.steps),
                   c.pp > 1 ? fmt::format(" | bubble {:.1f}% measured (rank 0 waiting), {:.1f}% predicted",
                                          100 * wait / dt, 100 * predicted)
                            : "");
        const std::string hidden = exposed_comm_text(exposed, dt, planned_comm);
        if (!hidden.empty()) fmt::print("step {:>5} | {}\n", s, hidden);
      }
      // The estimate's check, once every buffer has been touched (the shared-memory segments' second
      // buffers by step 2's collectives).
      if (mem_estimate && s == std::min(start + 2, last)) {
        fmt::print("{}\n", memory_check_line(*mem_estimate, peak_rss_bytes(), file_resident_bytes(),
                                             static_cast<double>(tensor_memory::peak_bytes()), s));
      }
      if (!val.empty()) {
        fmt::print("step {:>5} | validation loss {:.4f}{}\n", s, val[0],
                   pairwise(c.method) ? metrics_text(engine.objective().metrics(), {val.begin() + 1, val.end()})
                                     : fmt::format(" | perplexity {:.2f}", std::exp(val[0])));
      }
      if (!source_val.empty()) {
        std::string line;
        for (const auto& [name, v] : source_val) line += fmt::format(" | {} {:.4f} (perplexity {:.2f})", name, v, std::exp(v));
        fmt::print("step {:>5} | validation loss by source{}\n", s, line);
      }
      if (!sources.empty() && (eval_step || s == start + 1)) {
        std::string line;
        for (const auto& src : sources) {
          line += fmt::format(" | {} {:.1f}% of windows, {} tokens, {:.3f} epochs", src.name,
                              100.0 * static_cast<double>(src.taken) / static_cast<double>(s * c.global_batch),
                              source_tokens(src), src.epochs());
        }
        fmt::print("step {:>5} | sources{}\n", s, line);
      }
      for (const auto& [name, sc] : scores) {
        fmt::print("step {:>5} | task {}: acc {:.4f} | acc_norm {:.4f} | answer log-likelihood {:.6f} ({} questions)\n",
                   s, name, sc.acc(), sc.acc_norm(), sc.mean_answer_ll(), sc.questions);
      }
      if (metrics.is_open()) {
        nlohmann::json j{{"step", s},           {"loss", r.loss},         {"lr", r.lr},
                         {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_s}, {"mfu", mfu},
                         {"peak_mem_bytes", peak_rss_bytes()}, {"tokens", r.tokens}, {"elapsed_s", elapsed}};
        if (computes_on_cuda()) j["peak_device_bytes"] = peak_device_bytes();  // the CUDA caching allocator's
        for (const auto& [name, value] : r.metrics) j[name] = value;
        if (!r.expert_tokens.empty()) j["moe_tokens_per_expert"] = r.expert_tokens;  // per MoE layer
        if (c.ep > 1) j["moe_all_to_all_s"] = a2a;  // rank 0's seconds in the step's all-to-alls
        if (!val.empty()) {
          j["val_loss"] = val[0];
          const auto names = engine.objective().metrics();
          for (size_t i = 0; i < names.size() && 1 + i < val.size(); ++i) j["val_" + names[i]] = val[1 + i];
        }
        for (const auto& [name, v] : source_val) j["val_loss_" + name] = v;
        for (const auto& src : sources) {
          j["source_tokens"][src.name] = source_tokens(src);
          j["source_epochs"][src.name] = src.epochs();
        }
        for (const auto& [name, sc] : scores) {
          j["task_" + name + "_acc"] = sc.acc();
          j["task_" + name + "_acc_norm"] = sc.acc_norm();
          j["task_" + name + "_answer_ll"] = sc.mean_answer_ll();
        }
        if (engine.scaler()) {
          j["loss_scale"] = r.loss_scale;
          j["skipped"] = r.skipped;
        }
        if (c.pp > 1) j["bubble_measured"] = wait / dt;
        for (const auto& [axis, seconds] : exposed) {
          if (seconds > 0) j["exposed_comm_s"][axis] = seconds;  // rank 0's seconds blocked in the axis's collectives
        }
        for (const auto& [axis, seconds] : planned_comm) j["planned_exposed_comm_s"][axis] = seconds;
        if (r.dropped) j["update_dropped"] = true;
        if (!event.is_null()) j["spike"] = event;
        metrics << j.dump() << "\n" << std::flush;
      }
    }
    if (saver) {
      const int64_t done = saver->poll();  // an async save completes (or fails, on every rank) here
      if (done >= 0 && lead) fmt::print("step {:>5} | checkpoint {}/{} written\n", s, c.ckpt_dir, ckpt::step_dir_name(done));
    }
    if ((c.ckpt_every > 0 && s % c.ckpt_every == 0) || s == last) save(s);
    if (s == start + 1 && lead) fmt::print("{}", engine.memory_report(dp.size(), c.precision));
    if (s == std::min(start + 2, last)) tensor_memory::uninstall();  // checked: later steps at full speed
  }
  if (saver) {
    saver->finish();
    mesh.world().barrier();
  }
  return 0;
}

}  // namespace meshtrain
