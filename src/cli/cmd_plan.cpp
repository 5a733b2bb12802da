// meshtrain plan --model llama2-70b --gpus 1024 --gpu h100 --seq 4096 --global-batch 1024
//                [--tp N --pp N --vpp N --cp N --ep N --dp N --zero K --micro-batch N --recompute R]
//                [--precision P] [--gpus-per-node N] [--top K] [--json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <tuple>

#include "meshtrain/plan/schedule.h"

#include <memory>

#include "cli/commands.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/plan/posttrain.h"
#include "meshtrain/plan/posttrain_search.h"
#include "meshtrain/plan/deepspeed_estimate.h"
#include "meshtrain/plan/explain.h"
#include "meshtrain/plan/hf_config.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/plan/typical.h"
#include "meshtrain/plan/validation.h"

namespace meshtrain::cli {
namespace {

nlohmann::json to_json(const plan::Strategy& s) {
  return {{"tp", s.tp},
          {"cp", s.cp},
          {"ep", s.ep},
          {"dp", s.dp},
          {"pp", s.pp},
          {"vpp", s.vpp},
          {"sp", s.sp},
          {"zero", s.zero},
          {"recompute", plan::to_string(s.recompute)},
          {"micro_batch", s.micro_batch},
          {"schedule", plan::to_string(s.schedule)},
          {"precision", plan::to_string(s.precision)},
          {"offload", s.offload}};
}

nlohmann::json to_json(const plan::StageLedger& stage) {
  nlohmann::json lines = nlohmann::json::array();
  for (const auto& l : stage.lines)
    lines.push_back({{"item", l.item}, {"bytes", l.bytes}, {"formula", l.formula}, {"host", l.host}});
  return {{"stage", stage.stage}, {"layers", stage.layers}, {"lines", lines}};
}

nlohmann::json to_json(const plan::PostTrainCandidate& c) {
  return {{"strategy", to_json(c.strategy)}, {"peak_bytes", c.peak_bytes}, {"step_s", c.step_s},
          {"ledger", to_json(c.ledger)}};
}

nlohmann::json to_json(const plan::Candidate& c) {
  const auto& s = c.strategy;
  nlohmann::json j;
  j["strategy"] = to_json(s);
  j["peak_bytes"] = c.peak_bytes;
  for (const auto* stage : {&c.memory.first, &c.memory.last}) j["ledger"].push_back(to_json(*stage));
  const auto& e = c.estimate;
  j["estimate"] = {{"step_s", e.step_s},     {"compute_s", e.compute_s},       {"bubble_fraction", e.bubble_fraction},
                   {"exposed_comm_s", e.exposed_comm_s}, {"tokens_per_s", e.tokens_per_s}, {"mfu", e.mfu},
                   {"model_flops", e.model_flops}, {"optimizer_s", e.optimizer_s}};
  if (s.offload) {
    j["estimate"]["offload"] = {{"gradient_copies_s", e.offload.copies},
                                {"gradient_copies_exposed_s", e.offload.copies_exposed},
                                {"host_adam_s", e.offload.host_adam}, {"params_up_s", e.offload.params_up}};
  }
  for (const auto& [axis, t] : e.traffic)
    j["traffic"][axis] = {{"bytes", t.bytes}, {"inter_node", t.inter_node}, {"seconds", t.seconds}, {"exposed", t.exposed}};
  return j;
}

// --model: a preset, a Hugging Face config (a .json file or a directory holding config.json), or a meshtrain
// training config (.toml), with the shape flags applied; none: the shape from the flags alone.
plan::ModelSpec model_of(const std::string& arg, const std::string& family, const plan::ShapeFlags& shape,
                         int64_t seq) {
  namespace fs = std::filesystem;
  if (arg.empty()) return plan::model_from_flags(family, shape, seq);
  plan::ModelSpec m;
  if (arg.size() > 5 && arg.substr(arg.size() - 5) == ".toml") {
    m = load_train_config(arg, {}).model;
  } else if ((arg.size() > 5 && arg.substr(arg.size() - 5) == ".json") || fs::is_directory(arg)) {
    m = plan::model_from_hf_config_file(arg);
  } else {
    m = plan::preset(arg);
  }
  return plan::apply_shape_flags(m, shape);
}

}  // namespace

Run add_plan(CLI::App& app) {
  struct Opts {
    std::string model, gpu = "h100", precision = "bf16", recompute;
    int gpus = 8, per_node = 0, top = 5;
    int64_t seq = 0, global_batch = 0;
    int tp = 0, pp = 0, vpp = 0, cp = 0, ep = 0, dp = 0, zero = -1;
    int64_t micro_batch = 0;
    bool json = false, causal = false, tp_overlap = false, no_dp_overlap = false, explain = false, typical = false;
    bool param_gather_overlap = false;
    std::string method = "pretrain", lora_targets = "qv", family = "llama";
    plan::ShapeFlags shape;
    int64_t lora_rank = 8;
    double peak_tflops = 0;
    bool no_sp = false;
    bool offload = false;
    bool no_flash = false;
    bool eager = false, sac_op = false, fp8_params = false;
    std::string convention = "zero", optimizer_states = "fp32";
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("plan", "memory ledger, communication, step time and a strategy search");
  cmd->add_option("--model", o->model,
                  "a preset name (see the error for the list), a Hugging Face config.json (or its directory), or a "
                  "meshtrain training config (.toml)");
  cmd->add_option("--family", o->family, "without --model: the shape flags start from a gpt or llama layer")
      ->capture_default_str();
  for (auto [flag, ptr, help] :
       {std::tuple{"--layers", &o->shape.layers, "transformer layers"}, {"--hidden", &o->shape.hidden, "hidden size"},
        {"--heads", &o->shape.heads, "attention heads"}, {"--kv-heads", &o->shape.kv_heads, "key/value heads (GQA)"},
        {"--ffn", &o->shape.ffn, "FFN width"}, {"--vocab", &o->shape.vocab, "vocabulary"},
        {"--experts", &o->shape.experts, "routed experts (MoE)"}, {"--top-k", &o->shape.top_k, "experts per token"},
        {"--expert-ffn", &o->shape.expert_ffn, "each expert's FFN width"}}) {
    cmd->add_option(flag, *ptr, std::string(help) + " (replaces the model's)");
  }
  // meshtrain plan schedule --pp P --microbatches M --schedule S [--virtual V]
  struct Sched {
    int pp = 4, micro = 8, v = 1;
    std::string schedule = "1f1b", costs = "1,2";
  };
  auto so = std::make_shared<Sched>();
  auto sched = cmd->add_subcommand("schedule", "a pipeline schedule: checked, simulated, printed as a timeline");
  auto validate = cmd->add_subcommand("validate", "the time model against published, measured runs (a table)");
  sched->add_option("--pp", so->pp, "pipeline ranks")->capture_default_str();
  sched->add_option("--microbatches", so->micro, "micro-batches per step")->capture_default_str();
  sched->add_option("--schedule", so->schedule, "gpipe 1f1b interleaved zb-h1")->capture_default_str();
  sched->add_option("--virtual", so->v, "virtual stages per rank (interleaved)")->capture_default_str();
  sched->add_option("--costs", so->costs, "F,B (or F,B,W for zb-h1) in units of time")->capture_default_str();
  cmd->add_option("--gpus", o->gpus, "number of GPUs");
  cmd->add_option("--gpu", o->gpu, "h100 h200 a100 a100-40g v100 b200 cpu");
  cmd->add_option("--gpus-per-node", o->per_node, "GPUs per node (default: the GPU preset's)");
  cmd->add_option("--peak-tflops", o->peak_tflops,
                  "the device's 16-bit matrix peak (default: the GPU preset's; cpu: this host's, measured and cached)");
  cmd->add_option("--seq", o->seq, "sequence length (default: the model's)");
  cmd->add_option("--global-batch", o->global_batch, "samples per step (default: 4 x gpus)");
  cmd->add_option("--precision", o->precision, "fp32 bf16 bf16-fp32grad fp8");
  for (auto [flag, ptr] : {std::pair{"--tp", &o->tp}, {"--pp", &o->pp}, {"--vpp", &o->vpp}, {"--cp", &o->cp},
                           {"--ep", &o->ep}, {"--dp", &o->dp}}) {
    cmd->add_option(flag, *ptr, "fix this degree");
  }
  cmd->add_option("--zero", o->zero, "fix the ZeRO stage (0-3)");
  cmd->add_option("--micro-batch", o->micro_batch, "fix the micro-batch size");
  cmd->add_option("--recompute", o->recompute, "fix recomputation: none selective full");
  cmd->add_flag("--tp-overlap", o->tp_overlap, "tp collectives run under GEMMs (Transformer Engine's userbuffers)");
  cmd->add_flag("--no-dp-overlap", o->no_dp_overlap, "gradients reduced after the backward, not during it");
  cmd->add_flag("--param-gather-overlap", o->param_gather_overlap,
                "ZeRO-1/2 gather the updated parameters under the next forward (Megatron-LM's --overlap-param-gather)");
  cmd->add_flag("--no-sp", o->no_sp, "tp without sequence parallelism (Korthikanti et al.'s baseline)");
  cmd->add_flag("--no-flash", o->no_flash, "attention materialised (flash-style kernels are assumed where the GPU has them)");
  cmd->add_flag("--eager", o->eager,
                "elementwise ops unfused, as eager PyTorch runs a Llama written op by op (torchtitan without "
                "torch.compile; plan/step_time.h)");
  cmd->add_flag("--sac-op", o->sac_op,
                "selective recomputation is torchtitan's per-op policy (selective_ac_option = op: every second "
                "matmul and the elementwise ops recomputed) instead of Korthikanti et al.'s");
  cmd->add_flag("--offload", o->offload,
                "optimizer states and fp32 weights in host memory, Adam on the host (ZeRO-Offload; ZeRO 1-3)");
  cmd->add_option("--optimizer-states", o->optimizer_states,
                  "fp32: Adam's master weights, m and v in 12 B a parameter; bf16: in 6 B (Apex's DistributedFusedAdam "
                  "with dtype = bf16, NeMo's fine-tuning recipes)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--fp8-params", o->fp8_params,
                "with --precision fp8: the linear weights held in FP8 alone, 1 B, no 16-bit copy (Transformer "
                "Engine's fp8_model_init, NeMo's fp8_params)");
  cmd->add_option("--convention", o->convention,
                  "zero: this planner's ledger (the ZeRO paper's 2 + 2 + 12 bytes, activations, buffers); deepspeed: "
                  "DeepSpeed's estimate_zero2/3_model_states_mem_needs tables, offload included")
      ->capture_default_str();
  cmd->add_flag("--causal-flops", o->causal, "count half the attention square in model FLOPs");
  cmd->add_option("--top", o->top, "how many ranked plans to print");
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_flag("--typical", o->typical, "the course's typical runs (7B, 70B, 1024 GPUs): plan, ledger, traffic, step");
  cmd->add_flag("--explain", o->explain, "also list every rule the search applied and what each rejected");
  cmd->add_option("--method", o->method, "pretrain, or post-training: sft dpo lora qlora ppo grpo (each searched)");
  cmd->add_option("--lora-rank", o->lora_rank, "LoRA rank");
  cmd->add_option("--lora-targets", o->lora_targets, "qv or all");
  return [o, so, sched, validate]() {
    if (validate->parsed()) {
      fmt::print("{}", plan::validation_table());
      return 0;
    }
    if (sched->parsed()) {
      const plan::Schedule kind = plan::parse_schedule(so->schedule);
      plan::PipelineSchedule s = plan::build_schedule(kind, so->pp, so->micro, so->v);
      plan::ActionCosts c;
      std::vector<double> v;
      std::stringstream in(so->costs);
      for (std::string part; std::getline(in, part, ',');) {
        try {
          v.push_back(std::stod(part));
        } catch (const std::exception&) {
          throw std::invalid_argument(fmt::format("--costs '{}' is not a list of numbers", so->costs));
        }
      }
      if (v.size() < 2 || v.size() > 3 || *std::min_element(v.begin(), v.end()) <= 0) {
        throw std::invalid_argument(fmt::format("--costs '{}' must be F,B or F,B,W, all positive", so->costs));
      }
      c.forward = v[0];
      c.backward = v[1] + (v.size() == 3 ? v[2] : 0);
      c.backward_input = v.size() == 3 ? v[1] : v[1] / 2;
      c.backward_weight = v.size() == 3 ? v[2] : v[1] / 2;
      const plan::SimulationResult r = plan::simulate(s, c);
      fmt::print("{}", plan::timeline(s, r, c));
      return 0;
    }
    if (o->typical) {
      fmt::print("{}", plan::typical_report());
      return 0;
    }
    if (o->model.empty() && !o->shape.any()) {
      throw std::invalid_argument("plan needs --model NAME|config.json|train.toml, or the shape as flags (--layers "
                                  "--hidden --heads ...), or a subcommand: `schedule`, `validate`");
    }
    plan::SearchInput in;
    in.model = model_of(o->model, o->family, o->shape, o->seq);
    in.gpu = plan::gpu_preset(o->gpu);
    if (o->offload && in.gpu.host_memory_bw <= 0) {
      throw std::invalid_argument(fmt::format("--offload: {} has no separate host to offload the optimizer to",
                                              in.gpu.name));
    }
    if (o->per_node < 0) throw std::invalid_argument(fmt::format("--gpus-per-node {} must be positive", o->per_node));
    if (o->per_node > 0) in.gpu.per_node = o->per_node;
    if (o->peak_tflops < 0) throw std::invalid_argument(fmt::format("--peak-tflops {} must be positive", o->peak_tflops));
    if (o->peak_tflops > 0) in.gpu.peak_flops = o->peak_tflops * 1e12;
    if (in.gpu.name == "cpu") {
      // This host, measured (cached per machine): its GEMM rate in the plan's dtype and its copy bandwidth;
      // GEMMs then run at that rate (efficiency 1: the measurement is already what a GEMM reaches). The
      // --gpus ranks share the host (--gpus-per-node of them per host when given).
      const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      const bool fp32 = o->precision == "fp32";
      const MachinePeak gemm = machine_peak(fp32 ? "gemm_fp32" : "gemm_bf16", cores, o->peak_tflops * 1e12,
                                            "--peak-tflops");
      const MachinePeak copy = machine_peak("copy", cores);
      const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
      const int ranks = std::max(1, o->per_node > 0 ? std::min(o->gpus, o->per_node) : o->gpus);
      in.gpu = plan::cpu_device(gemm.value, copy.value, ram, ranks);
      fmt::print("cpu: {:.4g} GFLOP/s ({} GEMM on {} cores, {}); copy {:.3g} GB/s ({}); {} rank(s) per host, each "
                 "{:.4g} GFLOP/s and {:.3g} GB/s\n",
                 gemm.value / 1e9, fp32 ? "fp32" : "bf16", cores, gemm.source, copy.value / 1e9, copy.source, ranks,
                 in.gpu.peak_flops / 1e9, in.gpu.memory_bw / 1e9);
    }
    if (o->top < 1) throw std::invalid_argument(fmt::format("--top {} must be at least 1", o->top));
    in.gpus = o->gpus;
    in.seq = o->seq > 0 ? o->seq : in.model.seq;
    if (o->seq < 0) throw std::invalid_argument(fmt::format("--seq {} must be positive", o->seq));
    in.global_batch = o->global_batch != 0 ? o->global_batch : 4LL * o->gpus;
    in.precision = plan::parse_precision(o->precision);
    in.estimate.time.tp_overlap = o->tp_overlap;
    in.estimate.time.dp_overlap = !o->no_dp_overlap;
    in.estimate.time.param_gather_overlap = o->param_gather_overlap;
    in.estimate.time.eager_elementwise = o->eager;
    in.fixed.sac_op = o->sac_op;
    in.fixed.bf16_optimizer = o->optimizer_states == "bf16";
    in.fixed.fp8_params = o->fp8_params;
    in.estimate.attn = o->causal ? plan::AttnFlops::Causal : plan::AttnFlops::Full;
    auto fix = [](int v, const char* flag) -> std::optional<int> {
      if (v < 0) throw std::invalid_argument(fmt::format("{} {} must be positive", flag, v));
      return v > 0 ? std::optional<int>(v) : std::nullopt;
    };
    in.fixed.tp = fix(o->tp, "--tp");
    in.fixed.pp = fix(o->pp, "--pp");
    in.fixed.vpp = fix(o->vpp, "--vpp");
    in.fixed.cp = fix(o->cp, "--cp");
    in.fixed.ep = fix(o->ep, "--ep");
    in.fixed.dp = fix(o->dp, "--dp");
    if (o->zero >= 0) in.fixed.zero = o->zero;
    if (o->micro_batch > 0) in.fixed.micro_batch = o->micro_batch;
    if (!o->recompute.empty()) in.fixed.recompute = plan::parse_recompute(o->recompute);
    if (o->no_sp) in.fixed.sp = false;
    if (o->no_flash) in.fixed.flash = false;
    if (o->offload) {
      if (o->convention == "deepspeed") {
        throw std::invalid_argument("--offload with --convention deepspeed: DeepSpeed's tables already list the "
                                    "offload_optimizer=cpu rows; drop --offload");
      }
      if (o->method != "pretrain") {
        throw std::invalid_argument(fmt::format("--offload plans pretraining's search; the --method {} ledger has no "
                                                "offload: drop one of them",
                                                o->method));
      }
      if (in.fixed.zero && *in.fixed.zero == 0) {
        throw std::invalid_argument("--offload moves each rank's ZeRO shard of the optimizer to the host: use --zero 1, "
                                    "2 or 3 (or leave --zero to the search)");
      }
      in.fixed.offload = true;
    }
    if (o->convention != "zero" && o->convention != "deepspeed") {
      throw std::invalid_argument(fmt::format("--convention '{}': use zero or deepspeed", o->convention));
    }
    if (o->convention == "deepspeed") {
      if (in.fixed.zero && *in.fixed.zero != 2 && *in.fixed.zero != 3) {
        throw std::invalid_argument(fmt::format("--convention deepspeed has estimators for ZeRO 2 and 3, not --zero {}",
                                                *in.fixed.zero));
      }
      // DeepSpeed's tables for the model's parameters (shared ones once) on these GPUs.
      const double params = static_cast<double>(plan::count_params(in.model).total);
      const double largest = plan::largest_layer_params(in.model);
      const int per_node = std::min(in.gpus, in.gpu.per_node), nodes = (in.gpus + per_node - 1) / per_node;
      fmt::print("{} on {} x {}, DeepSpeed's convention (model states only: no activations, buffers or "
                 "fragmentation)\n\n",
                 in.model.name, in.gpus, in.gpu.name);
      for (int stage : {2, 3}) {
        if (in.fixed.zero && *in.fixed.zero != stage) continue;
        fmt::print("ZeRO-{} (estimate_zero{}_model_states_mem_needs_all_cold):\n{}\n", stage, stage,
                   plan::format_deepspeed(stage, params, largest, per_node, nodes,
                                          stage == 2 ? plan::deepspeed_zero2(params, per_node, nodes)
                                                     : plan::deepspeed_zero3(params, largest, per_node, nodes)));
      }
      return 0;
    }
    if (o->method != "pretrain") {
      // Post-training: the method's ledger and step time over the searched layouts (plan/posttrain_search.h).
      plan::PostTrainInput pin;
      pin.search = in;
      pin.method = plan::post_train_method(o->method);
      pin.lora.rank = o->lora_rank;
      pin.lora.targets = o->lora_targets;
      const plan::PostTrainResult r = plan::search_post_training(pin);
      if (o->json) {
        nlohmann::json j;
        j["method"] = o->method;
        j["model"] = in.model.name;
        j["gpus"] = in.gpus;
        j["considered"] = r.considered;
        j["feasible"] = r.feasible;
        j["explanation"] = r.explanation;
        j["ranked"] = nlohmann::json::array();
        for (int i = 0; i < static_cast<int>(r.ranked.size()) && i < o->top; ++i) j["ranked"].push_back(to_json(r.ranked[i]));
        if (r.ranked.empty() && r.leanest) j["leanest"] = to_json(*r.leanest);
        fmt::print("{}\n", j.dump(2));
        return r.ranked.empty() ? 3 : 0;
      }
      for (const std::string& line : r.explanation) fmt::print("{}\n", line);
      if (r.ranked.empty()) return 3;
      const plan::PostTrainCandidate& best = r.ranked.front();
      if (plan::lora_method(pin.method)) {
        fmt::print("{} trainable adapter parameters (rank {}, {})\n", plan::lora_params(in.model, pin.lora),
                   pin.lora.rank, pin.lora.targets);
      }
      fmt::print("\nledger of the best, per GPU:\n{}", plan::format_ledger(best.ledger));
      fmt::print("\n{:>4}  {:<44} {:<10} {:>5} {:>10} {:>10}\n", "rank", "layout", "recompute", "mb", "memory",
                 "s/step");
      for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < o->top; ++i) {
        const plan::PostTrainCandidate& c = r.ranked[i];
        fmt::print("{:>4}  {:<44} {:<10} {:>5} {:>10} {:>10.3g}\n", i + 1, c.strategy.describe(),
                   plan::to_string(c.strategy.recompute), c.strategy.micro_batch, plan::human_bytes(c.peak_bytes),
                   c.step_s);
      }
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = plan::search(in);
    const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o->json) {
      nlohmann::json j;
      j["model"] = in.model.name;
      j["gpus"] = in.gpus;
      j["considered"] = r.considered;
      j["feasible"] = r.feasible;
      j["search_s"] = search_s;
      j["explanation"] = r.explanation;
      j["rules"] = r.rules;
      j["flops_convention"] = plan::flops_formula(in.estimate.attn);
      j["ranked"] = nlohmann::json::array();
      for (int i = 0; i < static_cast<int>(r.ranked.size()) && i < o->top; ++i) j["ranked"].push_back(to_json(r.ranked[i]));
      if (r.ranked.empty() && r.leanest) j["leanest"] = to_json(*r.leanest);
      fmt::print("{}\n", j.dump(2));
      return r.ranked.empty() ? 3 : 0;
    }
    const auto counts = plan::count_params(in.model);
    fmt::print("{}: {:.4g} parameters ({:.4g} active per token); {} x {} ({} per node), seq {}, global batch {}, {}\n",
               in.model.name, static_cast<double>(counts.total), static_cast<double>(counts.active), in.gpus,
               in.gpu.name, in.gpu.per_node, in.seq, in.global_batch, plan::to_string(in.precision));
    if (in.model.moe()) {
      const auto& ml = counts.moe_layer;
      fmt::print("MoE: {} of {} layers, each {} experts of width {} (top {}){}: {:.4g} expert parameters per layer, "
                 "{:.4g} in all; FLOPs count the active ones\n",
                 counts.moe_layers, in.model.layers, in.model.experts, in.model.expert_width(), in.model.top_k,
                 in.model.shared_experts > 0 ? fmt::format(" + {} shared", in.model.shared_experts) : "",
                 static_cast<double>(ml.expert), static_cast<double>(ml.expert * counts.moe_layers));
    }
    fmt::print("FLOPs convention: {}; MFU after PaLM with peak {:.4g} TFLOP/s\n", plan::flops_formula(in.estimate.attn),
               in.gpu.peak_flops / 1e12);
    fmt::print("{} valid plans considered in {:.3f} s, {} fit in {}\n\n", r.considered, search_s, r.feasible,
               plan::human_bytes(in.gpu.memory_bytes));
    for (const auto& line : r.explanation) fmt::print("{}\n", line);
    if (r.ranked.empty()) {
      if (r.leanest) fmt::print("\nLeanest plan's ledger:\n{}", plan::format_ledger(r.leanest->memory.peak()));
      return 3;
    }
    if (o->explain) {
      fmt::print("\nRules applied:\n");
      for (const auto& line : r.rules) fmt::print("  {}\n", line);
    }
    fmt::print("\n{:<4} {:<64} {:>11} {:>9} {:>11} {:>6}  {}\n", "rank", "strategy", "peak mem", "step s", "tokens/s",
               "MFU", "vs #1");
    for (int i = 0; i < static_cast<int>(r.ranked.size()) && i < o->top; ++i) {
      const auto& c = r.ranked[i];
      fmt::print("{:<4} {:<64} {:>11} {:>9.3f} {:>11.0f} {:>5.1f}%  {}\n", i + 1, c.strategy.describe(),
                 plan::human_bytes(c.peak_bytes), c.estimate.step_s, c.estimate.tokens_per_s, 100 * c.estimate.mfu,
                 i == 0 ? "" : plan::why_slower(c, r.ranked.front()));
    }
    const auto& best = r.ranked.front();
    fmt::print("\nLedger of the best plan (per rank):\n{}", plan::format_ledger(best.memory.first));
    if (best.strategy.pp > 1) fmt::print("{}", plan::format_ledger(best.memory.last));
    fmt::print("\nCommunication per rank per step:\n");
    for (const auto& [axis, t] : best.estimate.traffic) {
      if (t.bytes == 0) continue;
      fmt::print("  {:<3} {:>12}  {:>8.3f} s  {}\n", axis, plan::human_bytes(t.bytes), t.seconds,
                 t.inter_node ? "across nodes" : "inside a node");
    }
    const auto& w = best.estimate.microbatch;
    fmt::print("One micro-batch through the slowest stage: GEMMs {:.4f} s, attention {:.4f} s, memory-bound {:.4f} s, "
               "exposed tp {:.4f} s, cp {:.4f} s, ep {:.4f} s\n",
               w.gemm, w.attention, w.memory, w.tp, w.cp, w.ep);
    fmt::print("Step: compute {:.3f} s + bubble {:.3f} s + exposed communication {:.3f} s + optimizer {:.3f} s = {:.3f} s\n",
               best.estimate.compute_s, best.estimate.bubble_s, best.estimate.exposed_comm_s,
               best.estimate.optimizer_s, best.estimate.step_s);
    if (best.strategy.offload) {
      const auto& off = best.estimate.offload;
      fmt::print("Optimizer on the host: gradient copies {:.3f} s ({:.3f} s not under the backward), Adam {:.3f} s, "
                 "weights up {:.3f} s\n",
                 off.copies, off.copies_exposed, off.host_adam, off.params_up);
    }
    return 0;
  };
}

}  // namespace meshtrain::cli
