// The core's config keys, one row each (train/config_keys.h), the registry that methods add
// theirs to, and --print-config / --help-config over them.
#include "meshtrain/train/config_keys.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/train/method.h"

namespace meshtrain {
namespace {

using namespace config_key;

// `k`, read only by the runs for which `why` returns "" (ConfigKey::unread).
ConfigKey read_when(ConfigKey k, std::function<std::string(const TrainConfig&)> why) {
  k.unread = std::move(why);
  return k;
}

// Why a run does not read a key of the pipeline, of context parallelism, of DDP, of FP8, of the spike
// detector, of checkpoints, of the evaluation tasks, of LoRA, of QLoRA, and what would ("" where it does).
std::string unless_pipeline(const TrainConfig& c) {
  return c.pp > 1 ? "" : "parallel.pp = 1: the run has no pipeline (set parallel.pp)";
}
std::string unless_context_parallel(const TrainConfig& c) {
  return c.cp > 1 ? "" : "parallel.cp = 1: the run has no context parallelism (set parallel.cp)";
}
std::string unless_ddp(const TrainConfig& c) {
  return c.zero == 0 ? "" : fmt::format("parallel.zero = {}: ZeRO reduces the gradients itself, without DDP's buckets "
                                        "(parallel.zero = 0 is DDP)", c.zero);
}
std::string unless_fp8(const TrainConfig& c) {
  return c.precision == "fp8"
             ? ""
             : fmt::format("train.precision = \"{}\": no FP8 linears (set train.precision = \"fp8\")", c.precision);
}
std::string unless_spike_detector(const TrainConfig& c) {
  return c.spike.policy != SpikePolicy::Off ? "" : "spike.policy = \"off\": nothing is detected (set spike.policy)";
}
std::string unless_rollback(const TrainConfig& c) {
  return c.spike.policy == SpikePolicy::Rollback
             ? ""
             : fmt::format("spike.policy = \"{}\": only \"rollback\" reloads a checkpoint and drops batches",
                           spike_policy_name(c.spike.policy));
}
std::string unless_saving(const TrainConfig& c) {
  return !c.ckpt_dir.empty() ? "" : "checkpoint.dir = \"\": the run saves no checkpoint (set checkpoint.dir)";
}
std::string unless_eval_tasks(const TrainConfig& c) {
  return !c.eval_tasks.empty() ? "" : "eval.tasks = []: no task is scored (set eval.tasks)";
}
std::string unless_lora(const TrainConfig& c) {
  return c.lora.rank > 0 ? "" : "lora.rank = 0: the run trains no LoRA adapters (set lora.rank)";
}
std::string unless_qlora(const TrainConfig& c) {
  return c.lora_quantize == "nf4"
             ? ""
             : fmt::format("lora.quantize = \"{}\": the base is not quantised (set lora.quantize = \"nf4\")",
                           c.lora_quantize);
}

// [data] sources: a list of tables {name, path, weight, val} (data/mixture.h).
ConfigKey sources_key() {
  const char* name = "data.sources";
  ConfigKey k{name, "list of {name, path, weight, val}", "weight > 0", "a mixture: token shards blended by weight",
              {}, {}, {}};
  k.set = [=](TrainConfig& c, const toml::node& n) {
    const toml::array* arr = n.as_array();
    if (!arr) wrong_type(name, "a list of tables: [{name = \"a\", path = \"a/train.bin\", weight = 0.7}, ...]");
    c.sources.clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::node& e = *arr->get(i);
      const auto line = e.source().begin.line;
      const std::string where = line > 0 ? fmt::format("{}[{}] (line {})", name, i, line) : fmt::format("{}[{}]", name, i);
      const toml::table* t = e.as_table();
      if (!t) throw std::invalid_argument(fmt::format("{} must be a table {{name, path, weight}}", where));
      MixtureSource src;
      bool has_weight = false;
      for (const auto& [key, value] : *t) {
        const std::string kname(key.str()), full = where + "." + kname;
        if (kname == "name") src.name = as_string(value, full);
        else if (kname == "path") src.shards = as_strings(value, full);
        else if (kname == "val") src.val = as_strings(value, full);
        else if (kname == "weight") {
          const auto v = value.value<double>();
          if (!v || !(value.is_floating_point() || value.is_integer())) wrong_type(full, "a number");
          src.weight = *v;
          has_weight = true;
        } else {
          throw std::invalid_argument(fmt::format("{}: unknown key '{}' (a source has name, path, weight, val)", where,
                                                  kname));
        }
      }
      if (!has_weight) throw std::invalid_argument(fmt::format("{}: no weight (weights are relative: 0.7 and 0.3)", where));
      try {
        check_sources({src});
      } catch (const std::invalid_argument& e) {
        std::string m = e.what();  // "data.sources[0] (name): ..." -> this source's place and line
        throw std::invalid_argument(where + m.substr(m.find(':')));
      }
      c.sources.push_back(std::move(src));
    }
    if (!c.sources.empty()) check_sources(c.sources);  // names that repeat across sources ([]: no mixture)
  };
  k.show = [](const TrainConfig& c) {
    std::vector<std::string> items;
    auto list = [](const std::vector<std::string>& v) {
      std::vector<std::string> q;
      for (const auto& x : v) q.push_back(toml_string(x));
      return fmt::format("[{}]", fmt::join(q, ", "));
    };
    for (const auto& s : c.sources) {
      items.push_back(fmt::format("{{name = {}, path = {}, weight = {}{}}}", toml_string(s.name), list(s.shards), s.weight,
                                  s.val.empty() ? "" : ", val = " + list(s.val)));
    }
    return fmt::format("[{}]", fmt::join(items, ", "));
  };
  return k;
}

const char* schedule_name(LrSchedule s) {
  return s == LrSchedule::Constant ? "constant" : s == LrSchedule::Linear ? "linear" : "cosine";
}

#define FIELD(member) [](auto& c) -> auto& { return c.member; }

std::vector<ConfigKey> make_keys() {
  return {
      // [model] (after preset = "...", which picks the defaults)
      integer("model.layers", FIELD(model.layers), 1, kMaxInt, "transformer blocks"),
      integer("model.hidden", FIELD(model.hidden), 1, kMaxInt, "model width"),
      integer("model.heads", FIELD(model.heads), 1, kMaxInt, "attention heads"),
      integer("model.kv_heads", FIELD(model.kv_heads), 1, kMaxInt, "key/value heads (GQA/MQA when fewer than heads)"),
      integer("model.ffn", FIELD(model.ffn), 1, kMaxInt, "feed-forward width"),
      integer("model.vocab", FIELD(model.vocab), 1, kMaxInt, "vocabulary size: the tokenizer's"),
      number("model.dropout", FIELD(model.dropout), 0, false, 1, true, "dropout probability"),
      number("model.init_std", FIELD(model.init_std), 0, true, kInf, false, "standard deviation of the initial weights"),
      boolean("model.tied", FIELD(model.tied), "the output head shares the embedding"),
      number("model.rope_theta", FIELD(model.rope_theta), 0, true, kInf, false,
             "RoPE's base: position p turns pair i by p x theta^(-2i/d) (Llama 3: 500000)"),
      number("model.norm_eps", FIELD(model.norm_eps), 0, true, kInf, false, "the norms' epsilon"),
      choice("model.attention", FIELD(model.attention), plan::parse_attention, plan::attention_name, "naive | tiled | auto",
             "tiled: FlashAttention-2 style, memory linear in the sequence; auto: tiled from 2048 keys on"),
      // Mixture of experts (moe/layer.h); experts = 0: dense
      integer("model.experts", FIELD(model.experts), 0, kMaxInt, "routed experts per MoE layer (0: dense)"),
      integer("model.top_k", FIELD(model.top_k), 0, kMaxInt, "experts each token is routed to (1..experts with MoE)"),
      integer("model.moe_every", FIELD(model.moe_every), 1, kMaxInt, "layer i is MoE when i % moe_every == 0"),
      integer("model.shared_experts", FIELD(model.shared_experts), 0, kMaxInt, "always-on experts (DeepSeekMoE)"),
      integer("model.expert_ffn", FIELD(model.expert_ffn), 0, kMaxInt, "an expert's FFN width (0: model.ffn)"),
      number("model.capacity_factor", FIELD(model.capacity_factor), 0, false, kInf, false,
             "expert capacity = ceil(factor x tokens x top_k / experts); 0: dropless"),
      text("model.router", FIELD(model.router), "softmax | sigmoid", "how router scores are made"),
      number("model.aux_loss_coef", FIELD(model.aux_loss_coef), 0, false, kInf, false,
             "weight of the load-balancing loss (Switch)"),
      number("model.z_loss_coef", FIELD(model.z_loss_coef), 0, false, kInf, false, "weight of the router z-loss (ST-MoE)"),
      // [data]
      texts("data.train", FIELD(train_shards), "token shards to train on (meshtrain tokenize)"),
      texts("data.val", FIELD(val_shards), "token shards to validate on"),
      sources_key(),
      // [train]
      text("train.method", FIELD(method), "a registered method", "what the run trains (--help-config lists them)"),
      integer("train.steps", FIELD(steps), 1, kMaxInt, "optimizer steps"),
      integer("train.micro_batch", FIELD(micro_batch), 1, kMaxInt, "sequences per rank per forward"),
      integer("train.global_batch", FIELD(global_batch), 1, kMaxInt, "sequences per optimizer step, all ranks"),
      integer("train.seq", FIELD(seq), 1, kMaxInt, "tokens per sequence"),
      integer("train.seed", FIELD(seed), 0, kMaxInt, "seeds the initial weights, data order and dropout"),
      number("train.lr", FIELD(optim.lr), 0, true, kInf, false, "peak learning rate"),
      integer("train.warmup", FIELD(optim.warmup_steps), 0, kMaxInt, "linear warmup steps"),
      choice("train.schedule", FIELD(optim.schedule), parse_lr_schedule, schedule_name, "constant | linear | cosine",
             "learning rate after warmup"),
      number("train.min_lr_ratio", FIELD(optim.min_lr_ratio), 0, false, 1, false, "final learning rate / lr"),
      number("train.weight_decay", FIELD(optim.weight_decay), 0, false, kInf, false, "AdamW's decoupled weight decay"),
      number("train.clip", FIELD(optim.clip_norm), 0, false, kInf, false, "gradient norm clip (0: none)"),
      text("train.recompute", FIELD(recompute), "none | selective | full", "activation recomputation"),
      text("train.precision", FIELD(precision), "fp32 | bf16 | fp16 | fp8",
           "compute precision (fp32 master weights; fp8: the blocks' linears in FP8, the rest bf16)"),
      read_when(text("train.fp8_scaling", FIELD(fp8_scaling), "current | delayed",
           "fp8: each scale from the tensor's own amax, or from the last fp8_history steps' amaxes"), unless_fp8),
      read_when(integer("train.fp8_history", FIELD(fp8_history), 1, kMaxInt, "fp8 delayed scaling: steps of amax history"),
                unless_fp8),
      read_when(integer("train.fp8_margin", FIELD(fp8_margin), 0, 16, "fp8: scales divided by 2^margin (headroom)"),
                unless_fp8),
      text("train.device", FIELD(device), "cpu | cuda | auto",
           "where the run computes (auto: cuda when this machine has a CUDA device, else cpu)"),
      number("train.peak_tflops", FIELD(peak_tflops), 0, false, kInf, false,
             "MFU denominator, TFLOP/s (0: this host's GEMM rate, measured once and cached)"),
      boolean("train.document_mask", FIELD(document_mask), "packed documents do not attend to each other"),
      boolean("train.repack", FIELD(repack), "SFT: pack conversations afresh each epoch"),
      integer("train.log_every", FIELD(log_every), 1, kMaxInt, "steps between log lines"),
      integer("train.eval_every", FIELD(eval_every), 1, kMaxInt, "steps between validations"),
      integer("train.eval_windows", FIELD(eval_windows), 0, kMaxInt,
              "validation windows (the first of its order, the same on every mesh; 0: all)"),
      text("train.metrics", FIELD(metrics), "", "JSON-lines file of per-step metrics (\"\": none)"),
      integer("train.stop_after", FIELD(stop_after), 0, kMaxInt, "stop (and save) after this step (0: run all)"),
      // [eval]
      texts("eval.tasks", FIELD(eval_tasks), "multiple-choice tasks scored at each validation (JSON lines)"),
      read_when(text("eval.tokenizer", FIELD(eval_tokenizer), "", "SentencePiece model of the tasks (\"\": beside data.train)"),
                unless_eval_tasks),
      // [parallel]
      integer("parallel.nproc", FIELD(nproc), 1, kMaxInt, "ranks meshtrain train starts on this machine"),
      integer("parallel.tp", FIELD(tp), 1, kMaxInt, "tensor-parallel size"),
      boolean("parallel.sp", FIELD(sp), "sequence parallelism (with tp)"),
      integer("parallel.cp", FIELD(cp), 1, kMaxInt, "context-parallel size"),
      read_when(text("parallel.cp_impl", FIELD(cp_impl), "ring | ulysses | allgather", "context-parallel attention"),
                unless_context_parallel),
      integer("parallel.ep", FIELD(ep), 1, kMaxInt, "expert-parallel size (experts split across ep ranks)"),
      integer("parallel.pp", FIELD(pp), 1, kMaxInt, "pipeline stages"),
      read_when(integer("parallel.virtual", FIELD(virtual_stages), 1, kMaxInt, "model chunks per pipeline rank (interleaved)"),
                unless_pipeline),
      read_when(text("parallel.schedule", FIELD(schedule), "gpipe | 1f1b | interleaved | zb-h1", "pipeline schedule"),
                unless_pipeline),
      read_when(integers("parallel.pp_layers", FIELD(pp_layers), 1,
               "layers of each pipeline stage in order, pp x virtual of them ([]: balanced by pp_balance)"),
                unless_pipeline),
      read_when(choice("parallel.pp_balance", FIELD(pp_balance), plan::parse_balance, plan::balance_name, "parameters | compute",
             "what the stages' layers balance: parameters (memory) or compute (matmul work per token: the head's "
             "multiply counted, the embedding lookup free)"), unless_pipeline),
      integer("parallel.zero", FIELD(zero), 0, 3,
              "0 DDP, 1 optimizer states sharded, 2 + gradients, 3 + parameters (FSDP)"),
      integer("parallel.dp_shard", FIELD(dp_shard), 0, kMaxInt, "HSDP: shard within groups of this many dp ranks (0: all)"),
      boolean("parallel.offload", FIELD(offload),
              "ZeRO-Offload, CUDA runs with parallel.zero 1 or 2: the fp32 master slices and Adam states in "
              "pinned host memory, AdamW on the host"),
      // [ddp]
      read_when(integer("ddp.bucket_mb", FIELD(ddp_bucket_mb), 1, kMaxInt, "gradient bucket size"), unless_ddp),
      read_when(boolean("ddp.overlap", FIELD(ddp_overlap), "all-reduce buckets during backward"), unless_ddp),
      boolean("ddp.find_unused", FIELD(ddp_find_unused), "parameters without a gradient count as zero"),
      // [zero]
      text("zero.param_dtype", FIELD(zero_param_dtype), "fp32 | bf16",
           "the device's parameters under ZeRO-3, or ZeRO-1/2 with parallel.offload (bf16: half the bytes, bf16 weights "
           "and residual stream, fp32 masters in the shards; needs train.precision = bf16)"),
      // [comm]
      number("comm.timeout", FIELD(comm_timeout), 0, true, kInf, false,
             "seconds a collective waits for a slow rank before the run fails (names the call)"),
      text("comm.backend", FIELD(comm_backend), "auto | nccl | gloo",
           "collectives of a CUDA run: nccl (one device per rank) or gloo (through host memory; ranks may share a "
           "device); auto: nccl on cuda, gloo on cpu"),
      integer("comm.check_every", FIELD(comm_check_every), 0, kMaxInt,
              "Gloo: the ranks compare their calls every N-th collective (1: every call, 0: never; shared memory: always)"),
      // [checkpoint]
      text("checkpoint.dir", FIELD(ckpt_dir), "", "directory of step_N checkpoints (\"\": none)"),
      read_when(integer("checkpoint.every", FIELD(ckpt_every), 0, kMaxInt, "steps between saves (0: at the end only)"),
                unless_saving),
      read_when(integer("checkpoint.keep", FIELD(ckpt_keep), 1, kMaxInt, "newest checkpoints kept"), unless_saving),
      read_when(boolean("checkpoint.async", FIELD(ckpt_async), "snapshot, then write in a background thread"),
                unless_saving),
      integer("checkpoint.staging_mb", FIELD(ckpt_staging_mb), 1, kMaxInt, "memory a load streams shards through"),
      number("checkpoint.timeout", FIELD(ckpt_timeout), 0, true, kInf, false,
             "seconds the checkpoint's collectives wait for a slow rank"),
      text("checkpoint.resume", FIELD(resume), "auto | none | PATH", "auto: the newest in dir, if any"),
      // [spike]
      choice("spike.policy", FIELD(spike.policy), parse_spike_policy, spike_policy_name, "off | log | skip | rollback",
             "what a loss spike does: report it, drop the update, or reload the newest checkpoint and drop the batches"),
      read_when(integer("spike.window", FIELD(spike.window), 2, kMaxInt, "steps the detector's median and MAD are taken over"),
                unless_spike_detector),
      read_when(integer("spike.warmup", FIELD(spike.warmup), 1, kMaxInt, "steps seen before a finite value can be a spike"),
                unless_spike_detector),
      read_when(number("spike.loss_z", FIELD(spike.loss_z), 0, true, kInf, false, "robust z-score of the loss that is a spike"),
                unless_spike_detector),
      read_when(number("spike.grad_z", FIELD(spike.grad_z), 0, true, kInf, false,
             "robust z-score of the gradient norm that is a spike"), unless_spike_detector),
      read_when(integer("spike.skip_batches", FIELD(spike.skip_batches), 1, kMaxInt,
              "rollback: global batches dropped, ending with the spike's"), unless_rollback),
      read_when(integer("spike.max_rollbacks", FIELD(spike.max_rollbacks), 1, kMaxInt,
              "rollback: rollbacks to one checkpoint before the run stops"), unless_rollback),
      // [check]
      integer("check.replicas_every", FIELD(check_replicas_every), 0, kMaxInt,
              "every N steps the data-parallel replicas compare their parameters' hashes (0: never)"),
      // [init]
      text("init.from", FIELD(init_from), "", "start from this checkpoint's weights (new optimizer, step 0)"),
      // [lora], [adapters]
      integer("lora.rank", FIELD(lora.rank), 0, kMaxInt, "LoRA rank (0: off)"),
      read_when(number("lora.alpha", FIELD(lora.alpha), 0, true, kInf, false, "LoRA scale numerator (scale = alpha / rank)"),
                unless_lora),
      read_when(number("lora.dropout", FIELD(lora.dropout), 0, false, 1, true, "dropout on the adapters' input"),
                unless_lora),
      read_when(texts("lora.targets", FIELD(lora.targets), "linears that get adapters (names, or \"all\")"),
                unless_lora),
      read_when(text("lora.quantize", FIELD(lora_quantize), "none | nf4", "nf4: QLoRA"), unless_lora),
      read_when(boolean("lora.double_quant", FIELD(lora_double_quant), "QLoRA: block scales in int8"), unless_qlora),
      integer("adapters.bottleneck", FIELD(adapters.bottleneck), 0, kMaxInt, "Houlsby adapter width (0: off)"),
  };
}

#undef FIELD

struct KeyRegistry {
  std::mutex mu;
  std::deque<ConfigKey> keys;  // a deque: what find_config_key returned stays put
  KeyRegistry() {
    for (auto& k : make_keys()) keys.push_back(std::move(k));
  }
};

KeyRegistry& key_registry() {
  static KeyRegistry r;
  return r;
}

}  // namespace

const std::deque<ConfigKey>& config_keys() { return key_registry().keys; }

void register_config_keys(std::vector<ConfigKey> keys) {
  KeyRegistry& r = key_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& k : keys) {
    if (find_config_key(k.name)) throw std::logic_error(fmt::format("config key {} is declared twice", k.name));
    r.keys.push_back(std::move(k));
  }
}

const ConfigKey* find_config_key(const std::string& name) {
  for (const auto& k : config_keys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::string print_config(const TrainConfig& c, bool every_section) {
  std::string out, section;
  const Method* method = find_method(c.method);
  for (const auto& k : config_keys()) {
    const std::string sec = k.name.substr(0, k.name.find('.'));
    if (!every_section && method && !reads_section(*method, sec)) continue;
    if (sec != section) {
      // A method's own section says whose it is (Method::sections): a run of another method refuses it.
      const std::vector<std::string> readers = methods_reading(sec);
      const std::string header = fmt::format("[{}]", sec);
      out += section.empty() ? "" : "\n";
      out += readers.empty() ? header + "\n"
                             : fmt::format("{:<32} # read only by train.method {}\n", header, fmt::join(readers, ", "));
      section = sec;
      if (sec == "model") {  // the preset sets the fields no key names (norm, positions, activation, bias, ...)
        out += fmt::format("{:<32} # string: the preset the fields below modify\n",
                           fmt::format("preset = {}", toml_string(c.model.name)));
      }
    }
    const std::string line = fmt::format("{} = {}", k.name.substr(sec.size() + 1), k.show(c));
    out += fmt::format("{:<32} # {}{}: {}\n", line, k.type, k.range.empty() ? "" : ", " + k.range, k.help);
  }
  return out;
}

std::string help_config() {
  std::string out = "# train.method: one of\n";
  for (const auto& name : method_names()) out += fmt::format("#   {:<10} {}\n", name, method_named(name).summary);
  TrainConfig defaults;
  defaults.model = plan::preset("gpt-tiny");  // as load_train_config starts
  return out + "\n" + print_config(defaults, true);
}

}  // namespace meshtrain
