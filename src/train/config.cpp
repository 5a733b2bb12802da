#include "meshtrain/train/config.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <toml.hpp>  // third_party/tomlplusplus (see its README.md)

#include "meshtrain/plan/strategy.h"
#include "meshtrain/train/method.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/nn/fp8.h"
#include "meshtrain/train/precision.h"
#include "meshtrain/train/config_keys.h"

namespace meshtrain {

std::vector<int64_t> stage_layer_counts(const TrainConfig& c) {
  std::vector<int64_t> out;
  for (const auto& r : plan::partition_layers(c.model, c.pp * c.virtual_stages, c.pp_layers, c.pp_balance)) {
    out.push_back(r.last - r.first);
  }
  return out;
}

std::vector<std::string> train_shards_of(const TrainConfig& c) {
  if (c.sources.empty()) return c.train_shards;
  std::vector<std::string> out;
  for (const auto& s : c.sources) out.insert(out.end(), s.shards.begin(), s.shards.end());
  return out;
}

namespace {

void apply(TrainConfig& c, const toml::table& t, const std::string& where) {
  for (const auto& [section, node] : t) {
    const std::string sec(section.str());
    const toml::table* tab = node.as_table();
    if (!tab) throw std::invalid_argument(fmt::format("{}: top-level key '{}' must be a [section]", where, sec));
    for (const auto& [key, value] : *tab) {
      const std::string full = sec + "." + std::string(key.str());
      if (full == "model.preset") continue;
      const ConfigKey* k = find_config_key(full);
      if (full == "train.eval_batches") {
        throw std::invalid_argument(fmt::format("{}: train.eval_batches is gone: validation covered micro_batch x dp "
                                                "windows per batch, another set on every mesh; set train.eval_windows "
                                                "(the first N windows of the validation order, 0 = all)",
                                                where));
      }
      if (!k) {
        std::string known;
        std::vector<std::string> sections;
        for (const auto& other : config_keys()) {
          if (other.name.rfind(sec + ".", 0) == 0) known += (known.empty() ? "" : ", ") + other.name;
          const std::string s = other.name.substr(0, other.name.find('.'));
          if (std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
        }
        throw std::invalid_argument(fmt::format("{}: unknown config key '{}'{}", where, full,
                                                known.empty() ? fmt::format("; sections are {}", fmt::join(sections, ", "))
                                                              : fmt::format("; known in [{}]: {}", sec, known)));
      }
      try {
        k->set(c, value);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{}: {}", where, e.what()));
      }
    }
  }
}

// A section that only some methods read ([dpo], [rl], [grpo], [ppo]: Method::sections), given to a
// run whose method reads none of it: one error naming its first key and the methods that read it.
void check_method_sections(const toml::table& t, const Method& method, const std::string& path) {
  for (const auto& [section, node] : t) {
    const std::string sec(section.str());
    const toml::table* keys = node.as_table();
    if (reads_section(method, sec) || !keys || keys->empty()) continue;
    const std::string readers = fmt::format("{}", fmt::join(methods_reading(sec), " or "));
    throw std::invalid_argument(fmt::format(
        "{}: {}.{} is given, and train.method = \"{}\" reads no [{}] section (train.method {} does): remove [{}] "
        "from the config (and --set {}.*), or set train.method to {}",
        path, sec, keys->begin()->first.str(), method.name, sec, readers, sec, sec, readers));
  }
}

// A key set away from its default that the run does not read (ConfigKey::unread: a pipeline
// schedule with parallel.pp = 1, checkpoint.keep without checkpoint.dir): one error naming the key,
// why and what would read it. A key from the file is judged by the file alone, so that a --set
// which switches a feature off (checkpoint.dir = "", parallel.pp = 1: the guides, `diagnose step`)
// takes the file's settings of it along; a key from --set is judged by the run. A key at its
// default is left alone (--print-config writes every key).
void check_unread_keys(const toml::table& file, const toml::table& t, const std::set<std::string>& from_set,
                       const TrainConfig& c, const std::string& path) {
  TrainConfig defaults, file_only;
  defaults.model = file_only.model = plan::preset(file["model"]["preset"].value_or(std::string("gpt-tiny")));
  bool file_alone = true;
  try {
    apply(file_only, file, path);
  } catch (const std::invalid_argument&) {
    file_alone = false;  // a value only --set makes valid: judge the file's keys by the run
  }
  for (const auto& [section, node] : t) {
    const toml::table* keys = node.as_table();
    if (!keys) continue;
    for (const auto& [key, value] : *keys) {
      const std::string name = std::string(section.str()) + "." + std::string(key.str());
      const ConfigKey* k = find_config_key(name);
      if (!k || !k->unread) continue;
      const TrainConfig& judge = from_set.count(name) || !file_alone ? c : file_only;
      const std::string why = k->unread(judge);
      if (why.empty() || k->show(judge) == k->show(defaults)) continue;
      throw std::invalid_argument(fmt::format("{}: {} = {} is set{}, and this run does not read it: {}; or remove {}",
                                              path, k->name, k->show(judge),
                                              from_set.count(name) ? " (--set)" : "", why, k->name));
    }
  }
}

// Mixture of experts and expert parallelism (moe/layer.h).
void check_moe(const TrainConfig& c, const std::string& path) {
  const plan::ModelSpec& m = c.model;
  if (c.ep > 1 && !m.moe()) {
    throw std::invalid_argument(fmt::format("{}: parallel.ep = {} splits the experts of MoE layers, and the model has "
                                            "none: set model.experts (and top_k) or parallel.ep = 1",
                                            path, c.ep));
  }
  if (!m.moe()) return;
  if (m.experts % c.ep != 0) {
    throw std::invalid_argument(fmt::format("{}: model.experts = {} is not divisible by parallel.ep = {}: each ep rank "
                                            "holds experts / ep of them; choose an ep that divides {}",
                                            path, m.experts, c.ep, m.experts));
  }
  // The router sees the tokens of its rank: under cp a chunk of each sequence, under SP a tp
  // shard of it. Its load-balancing statistics (aux, z) and capacity would then be per piece, not
  // per sequence as on one process: refused until they are summed over the cp (and tp) group.
  if (c.cp > 1) {
    throw std::invalid_argument(fmt::format("{}: model.experts = {} with parallel.cp = {}: the router would see each "
                                            "cp rank's chunks alone (its aux/z losses and capacity per chunk, not per "
                                            "sequence as on one process); not supported yet: set parallel.cp = 1",
                                            path, m.experts, c.cp));
  }
  if (c.tp > 1 && c.sp && m.capacity_factor > 0) {
    throw std::invalid_argument(fmt::format("{}: model.capacity_factor = {} with sequence parallelism (parallel.tp = "
                                            "{}, parallel.sp = true): capacity and drop priority would be per tp shard "
                                            "of the sequence, not per sequence as on one process; not supported yet: "
                                            "set model.capacity_factor = 0 (dropless) or parallel.sp = false",
                                            path, m.capacity_factor, c.tp));
  }
  if (c.ep > 1 && c.dp_shard > 0) {
    throw std::invalid_argument(fmt::format("{}: parallel.ep = {} with HSDP (parallel.dp_shard = {}): not supported; "
                                            "set parallel.dp_shard = 0",
                                            path, c.ep, c.dp_shard));
  }
}

}  // namespace

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: {} (line {})", path, e.description(), e.source().begin.line));
  }
  const toml::table file = t;  // before --set
  std::set<std::string> from_set;
  // --set section.key=value: parsed as TOML values ("3e-4", "true", "\"text\"").
  for (const auto& o : overrides) {
    const auto eq = o.find('='), dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      throw std::invalid_argument(fmt::format("--set '{}' is not section.key=value", o));
    }
    const std::string sec = o.substr(0, dot), key = o.substr(dot + 1, eq - dot - 1);
    std::string value = o.substr(eq + 1);
    // One TOML value ("3e-4", "true", "[1, 2]", "\"text\""), or else the text itself as a string (a bare
    // word); never more than the value (a newline in it must not add keys).
    toml::table one;
    try {
      one = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      one = toml::table{{"v", value}};
    }
    if (one.size() != 1 || !one.contains("v")) {
      throw std::invalid_argument(fmt::format("--set '{}': the value holds more than one TOML value (a newline?); "
                                              "give one --set per key", o));
    }
    if (!t.contains(sec)) t.insert(sec, toml::table{});
    auto* tab = t[sec].as_table();
    if (!tab) throw std::invalid_argument(fmt::format("--set '{}': [{}] is not a table in {}", o, sec, path));
    tab->insert_or_assign(key, *one.get("v"));
    from_set.insert(sec + "." + key);
  }
  TrainConfig c;
  const std::string preset = t["model"]["preset"].value_or(std::string("gpt-tiny"));
  c.model = plan::preset(preset);
  apply(c, t, path);
  c.model.seq = std::max(c.model.seq, c.seq);
  try {
    plan::validate(c.model);  // here, in the launching process, not once per rank
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
  const Method* method = find_method(c.method);
  if (!method) {
    throw std::invalid_argument(fmt::format("{}: train.method = \"{}\": use one of \"{}\"", path, c.method,
                                            fmt::join(method_names(), "\", \"")));
  }
  check_method_sections(t, *method, path);
  check_moe(c, path);
  if (c.train_shards.empty() && c.sources.empty() && method->token_data) {
    throw std::invalid_argument(fmt::format("{}: [data] train = \"...bin\" (or sources = [...]) is required", path));
  }
  if (!c.train_shards.empty() && !c.sources.empty()) {
    throw std::invalid_argument(fmt::format("{}: give data.train or data.sources, not both (a mixture lists every "
                                            "source's shards)", path));
  }
  // Types and ranges of single keys were checked as they were set (config_keys.cpp); what follows relates keys.
  if (c.dp_shard > 0 && c.zero == 0) {
    throw std::invalid_argument(fmt::format("{}: parallel.dp_shard = {} shards ZeRO's state within groups of that many "
                                            "data-parallel ranks: it needs parallel.zero >= 1",
                                            path, c.dp_shard));
  }
  try {
    plan::parse_schedule(c.schedule);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: parallel.schedule: {}", path, e.what()));
  }
  if (c.zero_param_dtype != "fp32" && c.zero_param_dtype != "bf16") {
    throw std::invalid_argument(fmt::format("{}: zero.param_dtype = \"{}\": use \"fp32\" (the default: the same "
                                            "computation as DDP) or \"bf16\"",
                                            path, c.zero_param_dtype));
  }
  if (c.zero_param_dtype == "bf16" && ((c.zero != 3 && !c.offload) || c.precision != "bf16")) {
    throw std::invalid_argument(fmt::format("{}: zero.param_dtype = \"bf16\" keeps bf16 copies of fp32 masters on the "
                                            "device: it needs train.precision = \"bf16\" and parallel.zero = 3 (gathered "
                                            "from the shards) or parallel.offload with zero 1 or 2 (the masters in host "
                                            "memory); they are precision \"{}\", zero {}, offload {}",
                                            path, c.precision, c.zero, c.offload));
  }
  if (c.zero_param_dtype == "bf16" && (c.tp > 1 || c.cp > 1 || c.ep > 1)) {
    throw std::invalid_argument(fmt::format("{}: zero.param_dtype = \"bf16\" is tested against one process on data "
                                            "parallelism only (Zero.Stage3InBf16GathersBf16CopiesOfFp32Shards): set "
                                            "parallel.tp, cp and ep to 1 (they are {}, {}, {}) or zero.param_dtype = "
                                            "\"fp32\"",
                                            path, c.tp, c.cp, c.ep));
  }
  if (!c.pp_layers.empty()) {
    if (c.pp == 1) {
      throw std::invalid_argument(fmt::format("{}: parallel.pp_layers lists layers per pipeline stage: it needs "
                                              "parallel.pp > 1 (remove it, or set pp)",
                                              path));
    }
    try {
      plan::partition_layers(c.model, c.pp * c.virtual_stages, c.pp_layers);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: parallel.pp_layers = [{}]: {}", path, fmt::join(c.pp_layers, ", "),
                                              e.what()));
    }
  }
  if (c.virtual_stages > 1 && (!c.pp_layers.empty() || c.pp_balance != plan::Balance::Parameters)) {
    throw std::invalid_argument(fmt::format("{}: parallel.pp_layers and parallel.pp_balance = \"compute\" are tested "
                                            "with one chunk per pipeline rank, not with parallel.virtual = {}: leave "
                                            "the interleaved schedule's cut to parameter balance",
                                            path, c.virtual_stages));
  }
  if (c.pp > 1 && c.zero >= 2) {
    throw std::invalid_argument(fmt::format("{}: parallel.zero = {} with parallel.pp = {}: stage 2 would reduce-scatter, "
                                            "and stage 3 re-gather, once per micro-batch on every stage; use "
                                            "parallel.zero = 1 (or 0) with pipeline parallelism",
                                            path, c.zero, c.pp));
  }
  if (c.spike.warmup > c.spike.window) {
    throw std::invalid_argument(fmt::format("{}: spike.warmup = {} exceeds spike.window = {}: the detector keeps only "
                                            "the last window steps, so it would never arm; lower warmup or widen the "
                                            "window",
                                            path, c.spike.warmup, c.spike.window));
  }
  if (c.spike.policy == SpikePolicy::Rollback && (c.ckpt_dir.empty() || c.ckpt_every == 0)) {
    throw std::invalid_argument(fmt::format("{}: spike.policy = \"rollback\" reloads the newest checkpoint: set "
                                            "checkpoint.dir and checkpoint.every (they are \"{}\" and {})",
                                            path, c.ckpt_dir, c.ckpt_every));
  }
  if (c.check_replicas_every > 0 && c.zero == 3) {
    throw std::invalid_argument(fmt::format("{}: check.replicas_every = {} compares data-parallel replicas of the "
                                            "parameters, and ZeRO-3 keeps none (each rank holds its own slice): set "
                                            "parallel.zero <= 2 or check.replicas_every = 0",
                                            path, c.check_replicas_every));
  }
  if (c.offload && c.zero != 1 && c.zero != 2) {
    throw std::invalid_argument(fmt::format("{}: parallel.offload moves each rank's ZeRO-1/2 slice of the master "
                                            "weights and Adam states to host memory, and parallel.zero is {}: set "
                                            "parallel.zero = 1 or 2, or remove parallel.offload",
                                            path, c.zero));
  }
  try {
    const plan::CpImpl impl = plan::parse_cp_impl(c.cp_impl);
    plan::validate_context_parallel(c.model, c.seq, c.cp, c.tp, c.sp, impl);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: parallel.cp = {}, cp_impl = \"{}\", train.seq = {}: {}", path, c.cp,
                                            c.cp_impl, c.seq, e.what()));
  }
  if (c.cp > 1 && c.model.dropout > 0) {
    throw std::invalid_argument(fmt::format("{}: parallel.cp = {} computes attention without dropout; set "
                                            "model.dropout = 0 (it is {})",
                                            path, c.cp, c.model.dropout));
  }
  if (method->check) method->check(c, path);
  if (c.model.attention == plan::AttentionImpl::Sdpa && (c.document_mask || c.cp > 1 || c.model.dropout > 0)) {
    throw std::invalid_argument(fmt::format(
        "{}: model.attention = \"sdpa\" is plain causal attention without dropout: it needs train.document_mask = "
        "false (it is {}), parallel.cp = 1 (it is {}) and model.dropout = 0 (it is {}); use \"auto\"",
        path, c.document_mask, c.cp, c.model.dropout));
  }
  if (c.document_mask && (c.model.attention == plan::AttentionImpl::Naive || c.cp > 1 || c.pp > 1)) {
    throw std::invalid_argument(fmt::format("{}: train.document_mask needs model.attention = \"tiled\" or \"auto\" (it is \"{}\"), "
                                            "parallel.cp = 1 (it is {}) and parallel.pp = 1 (it is {})",
                                            path, plan::attention_name(c.model.attention), c.cp, c.pp));
  }
  if (c.lora.rank > 0) {
    try {
      check_lora(c.model, c.lora);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
    }
  }
  // Adapters train with DDP or ZeRO-1/2 (the frozen base stays whole, out of ZeRO's flats), not ZeRO-3 or pp yet.
  if (c.lora.rank > 0 && (c.zero > 2 || c.pp > 1)) {
    throw std::invalid_argument(fmt::format("{}: LoRA (lora.rank = {}) trains with DDP or ZeRO-1/2 for now: "
                                            "parallel.zero must be at most 2 and parallel.pp 1 (they are {}, {})",
                                            path, c.lora.rank, c.zero, c.pp));
  }
  if (c.adapters.bottleneck > 0 && (c.zero > 2 || c.pp > 1 || c.lora.rank > 0)) {
    throw std::invalid_argument(fmt::format("{}: adapters.bottleneck = {} trains with DDP or ZeRO-1/2 "
                                            "and without LoRA for now: parallel.zero = {} (at most 2), parallel.pp = "
                                            "{} (1), lora.rank = {} (0)",
                                            path, c.adapters.bottleneck, c.zero, c.pp, c.lora.rank));
  }
  if (c.lora_quantize != "none" && c.lora_quantize != "nf4") {
    throw std::invalid_argument(fmt::format("{}: lora.quantize = \"{}\": use \"none\" or \"nf4\" (QLoRA)", path,
                                            c.lora_quantize));
  }
  if (c.lora_quantize == "nf4" && (c.lora.rank == 0 || c.init_from.empty() || c.tp > 1 || c.zero > 0)) {
    // The base is frozen and, in NF4, not checkpointed: it must come from [init] from to be found again.
    throw std::invalid_argument(fmt::format("{}: lora.quantize = \"nf4\" (QLoRA) quantises a pretrained base under "
                                            "LoRA adapters: it needs lora.rank > 0 (it is {}), init.from (it is "
                                            "\"{}\"), parallel.tp = 1 (it is {}) and parallel.zero = 0 (it is {})",
                                            path, c.lora.rank, c.init_from, c.tp, c.zero));
  }
  if (c.precision == "fp16" && c.pp > 1) {
    throw std::invalid_argument(fmt::format("{}: train.precision = \"fp16\" with parallel.pp = {}: the pipeline "
                                            "schedules have no loss scaler (an overflow in one stage must skip the "
                                            "step on every stage); use train.precision = \"bf16\" (no scaler "
                                            "needed) or parallel.pp = 1",
                                            path, c.pp));
  }
  if (c.precision == "fp8" || c.precision == "fp16") {
    // FP8 and fp16 are tested (parity matrix rows fp8, fp8_delayed, fp16, fp16_zero3;
    // ParityCli.Fp8UnderZero3ZeroBubbleAndRecomputation) on dense pretraining and SFT; elsewhere they are
    // refused until they are: a frozen reference or a critic would compute in another precision than the
    // policy, adapters and experts have no FP8 product, and no test covers them in fp16.
    std::string what;
    if (c.method != "pretrain" && c.method != "sft") what = fmt::format("train.method = \"{}\"", c.method);
    else if (c.lora.rank > 0) what = fmt::format("lora.rank = {} (LoRA, QLoRA)", c.lora.rank);
    else if (c.adapters.bottleneck > 0) what = fmt::format("adapters.bottleneck = {}", c.adapters.bottleneck);
    else if (c.model.experts > 0) what = fmt::format("model.experts = {} (MoE)", c.model.experts);
    if (!what.empty()) {
      throw std::invalid_argument(fmt::format("{}: train.precision = \"{}\" with {}: {} is tested on dense "
                                              "pretraining and SFT only; use train.precision = \"bf16\"",
                                              path, c.precision, what, c.precision == "fp8" ? "FP8" : "fp16"));
    }
  }
  try {
    plan::parse_recompute(c.recompute);
    parse_train_precision(c.precision);
    nn::parse_fp8_scaling(c.fp8_scaling);
    parse_device(c.device);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: train.{}", path, e.what()));
  }
  if (c.comm_backend != "auto" && c.comm_backend != "nccl" && c.comm_backend != "gloo") {
    throw std::invalid_argument(fmt::format("{}: comm.backend '{}' unknown; use auto, nccl or gloo", path, c.comm_backend));
  }
  check_unread_keys(file, t, from_set, c, path);
  c.optim.total_steps = c.steps;
  return c;
}

std::string without_unread_sections(const std::string& toml_text) {
  toml::table t = toml::parse(toml_text);
  const Method* method = find_method(t["train"]["method"].value_or(std::string("pretrain")));
  if (!method) return toml_text;  // load_train_config names the unknown method
  std::vector<std::string> unread;
  for (const auto& [section, node] : t) {
    if (!reads_section(*method, std::string(section.str()))) unread.emplace_back(section.str());
  }
  for (const std::string& sec : unread) t.erase(sec);
  std::ostringstream out;
  out << t;
  return out.str();
}

}  // namespace meshtrain
