// The training configuration: a TOML file plus `--set section.key=value`
// overrides. Every key is checked: an unknown key, a wrong type, a non-finite
// number or a value out of the key's range is one error naming it (and the
// file), before anything starts.
#pragma once

#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/data/mixture.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/peft/adapter.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/plan/partition.h"
#include "meshtrain/plan/spec.h"
#include "meshtrain/train/spike.h"

namespace meshtrain {

struct TrainConfig {
  plan::ModelSpec model;          // [model]: preset = "...", then any field
  std::vector<std::string> train_shards, val_shards;  // [data] train, val
  // [data] sources: a mixture (data/mixture.h) instead of data.train, each
  // source with its weight and, optionally, its own validation shards (a
  // validation loss per source).
  std::vector<MixtureSource> sources;
  int64_t steps = 100, micro_batch = 4, global_batch = 16, seq = 128;  // [train]
  uint64_t seed = 1;
  int64_t log_every = 10, eval_every = 50;
  // Validation windows (data/validation.h): the first N of the validation
  // order, the same on every mesh; 0 = all.
  int64_t eval_windows = 0;
  // [eval] tasks: multiple-choice tasks (data/choice_task.h) scored with the
  // validation (every train.eval_every steps and at the last), their accuracy
  // and length-normalised accuracy logged (train/choice_eval.h); tokenizer:
  // the SentencePiece model ("" = tokenizer.model beside data.train).
  std::vector<std::string> eval_tasks;
  std::string eval_tokenizer;
  std::string metrics;            // JSONL file, one object per step ("" = none)
  AdamWOptions optim;             // [train] lr, warmup, schedule, weight_decay, clip, min_lr_ratio
  int tp = 1;                     // [parallel] tp, sp, nproc
  bool sp = false;
  int nproc = 1;
  // [parallel] cp: context parallelism, each rank holds 2 zig-zag chunks of
  // every sequence (parallel/context/); cp_impl: ring | ulysses | allgather.
  int cp = 1;
  std::string cp_impl = "ring";
  // [parallel] ep: expert parallelism, the experts of each MoE layer split
  // across ep ranks, tokens dispatched to them by all-to-all (moe/layer.h);
  // ep ranks read different data (the data-parallel replicas are dp x ep).
  int ep = 1;
  // [parallel] zero: 0 = DDP, 1/2/3 = ZeRO stage (3 = FSDP); dp_shard: HSDP,
  // shard within groups of this many dp ranks (0 = all of dp); offload: ZeRO-Offload
  // (parallel/data/zero.h), CUDA runs with zero 1 or 2.
  int zero = 0;
  // [parallel] pp: pipeline stages; virtual: model chunks per pipeline rank
  // (interleaved); schedule: gpipe | 1f1b | interleaved | zb-h1.
  int pp = 1;
  int virtual_stages = 1;
  std::string schedule = "1f1b";
  // [parallel] pp_layers: layers of each of the pp x virtual stages (empty: balanced by pp_balance,
  // plan/partition.h: parameters (memory) or compute (the head's multiply counted)).
  std::vector<int64_t> pp_layers;
  plan::Balance pp_balance = plan::Balance::Parameters;
  int dp_shard = 0;
  bool offload = false;
  std::string recompute = "none";  // [train] recompute: none | selective | full
  std::string precision = "fp32";  // [train] precision: fp32 | bf16 | fp16 | fp8
  // [train] fp8_scaling, fp8_history, fp8_margin: train.precision = fp8's recipe (nn/fp8.h).
  std::string fp8_scaling = "current";
  int64_t fp8_history = 16;
  int64_t fp8_margin = 0;
  std::string device = "auto";     // [train] device: cpu | cuda | auto (platform/device.h)
  // [train] peak_tflops: the MFU's denominator (TFLOP/s); 0: this host's GEMM rate, measured before the
  // ranks start (train/gemm_peak.h: the run's dtype; bf16 runs the faster of bf16 and fp32).
  double peak_tflops = 0;
  // [train] document_mask: packed documents do not attend to each other and
  // their positions restart (the shards' document starts; needs tiled attention).
  bool document_mask = false;
  // [train] method: "pretrain" (every next token) | "sft" (the shards' loss
  // masks from `meshtrain tokenize chat`: assistant tokens only, data/chat.h)
  // | a registered method (train/method.h: "dpo", dpo/dpo.h, whose batch
  // sizes count pairs; "reward", "grpo", "ppo", rl/methods.h).
  std::string method = "pretrain";
  // [train] repack (SFT): shuffle the conversations and pack them afresh each
  // epoch (data/loader.h), rather than shuffling the blocks tokenize packed.
  bool repack = true;
  // The sections a method declares itself (train/config_keys.h; [dpo]: dpo/settings.h; [rl], [grpo],
  // [ppo]: rl/settings.h):
  // each method's own struct, by section name, default until a key sets it (settings<T> below).
  std::map<std::string, std::any> method_settings;
  // [ddp] (used when the data-parallel group has more than one rank)
  int64_t ddp_bucket_mb = 25;
  bool ddp_overlap = true;
  bool ddp_find_unused = false;
  // [zero] param_dtype: the dtype ZeRO-3 gathers the parameters in. "fp32"
  // (default): the fp32 weights, autocast casting them per op, the same
  // computation as DDP; "bf16": bf16 copies (FSDP's param_dtype = bf16; half
  // the gather bytes), so embeddings, norms and the residual stream are bf16
  // too: another computation, whose one-process reference is itself on one rank.
  std::string zero_param_dtype = "fp32";
  int64_t stop_after = 0;         // [train] stop_after: stop (and save) after this step; 0 = run all steps
  // [checkpoint]
  std::string ckpt_dir;           // dir: "" = no checkpoints
  int64_t ckpt_every = 0;         // every N steps (0: only at the end / at stop_after)
  int ckpt_keep = 2;              // keep: newest checkpoints kept
  bool ckpt_async = false;        // async: write in a background thread
  int64_t ckpt_staging_mb = 64;   // staging_mb: bound on the memory a load streams shards through
  double comm_timeout = 300;      // [comm] timeout: seconds a training collective waits for a slow rank
  int comm_check_every = 64;      // [comm] check_every: Gloo agreement check period (1 every call, 0 never)
  std::string comm_backend = "auto";  // [comm] backend: auto (nccl on cuda, gloo on cpu) | nccl | gloo
  double ckpt_timeout = 600;      // timeout: seconds the checkpoint's collectives wait for a slow rank
  std::string resume = "auto";
  SpikeOptions spike;
  // [check] replicas_every: every N steps (0: never) the data-parallel
  // replicas compare their parameters' hashes (train/replica_check.h).
  int64_t check_replicas_every = 0;             // [spike] the loss-spike detector and what a spike does (train/spike.h)    // resume: "auto" (newest in dir, if any) | "none" | a checkpoint path
  // [init] from: start from these weights (a checkpoint directory, any mesh):
  // new optimizer, step 0, data from the start. Ignored when resuming.
  std::string init_from;
  // [lora] rank (0 = off), alpha, dropout, targets: train LoRA adapters on a
  // frozen model (peft/lora.h); DDP or one replica, no pipeline, for now.
  LoraOptions lora{0};
  // [lora] quantize: "none" | "nf4" (QLoRA, peft/qlora.h: block linears in NF4,
  // blocks of 64; needs [init] from and tp = 1); double_quant: the block
  // scales in int8 (4.127 bits per weight) or fp32 (4.5).
  std::string lora_quantize = "none";
  bool lora_double_quant = true;
  // [adapters] bottleneck (0 = off): Houlsby adapters on a frozen model
  // (peft/adapter.h); DDP or one replica, no pipeline, for now.
  AdapterOptions adapters{0};
};

// Throws std::invalid_argument naming the file, section.key and the problem
// (each key's type and allowed range: src/train/config_keys.cpp).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);

// `meshtrain train --print-config`: every key with its value, as TOML that
// load_train_config reads back to the same config, each line commented with
// the key's type, allowed range and help. The sections only other methods read
// (Method::sections) are left out, unless `every_section`.
std::string print_config(const TrainConfig& c, bool every_section = false);
// A config's TOML text without the sections its train.method does not read: what
// checkpoints written before that was an error hold (every section, at its default).
std::string without_unread_sections(const std::string& toml_text);
// `meshtrain train --help-config`: the registered methods (train/method.h), each with its line,
// then every key at its default (the gpt-tiny preset), as print_config writes them.
std::string help_config();

// Layers of each of the pp x virtual pipeline stages, in order: parallel.pp_layers, or the split
// balanced by parallel.pp_balance (plan/partition.h); {layers} without pipeline parallelism.
std::vector<int64_t> stage_layer_counts(const TrainConfig& c);

// A method's own section of the config: its struct T (with T::kSection, the section's name),
// kept in TrainConfig::method_settings; the defaults until a key sets it.
template <class T>
T& settings(TrainConfig& c) {
  std::any& a = c.method_settings[T::kSection];
  if (!a.has_value()) a = T{};
  return std::any_cast<T&>(a);
}
template <class T>
const T& settings(const TrainConfig& c) {
  static const T defaults{};
  const auto it = c.method_settings.find(T::kSection);
  return it == c.method_settings.end() ? defaults : std::any_cast<const T&>(it->second);
}

// The shards a run trains on: data.train, or every source's.
std::vector<std::string> train_shards_of(const TrainConfig& c);

}  // namespace meshtrain
