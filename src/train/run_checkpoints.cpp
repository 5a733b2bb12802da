// A training run's checkpoints (train/run_checkpoints.h).
#include "meshtrain/train/run_checkpoints.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/plan/memory.h"
#include "meshtrain/plan/spec_json.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/config_keys.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/state.h"
#include "train/spike_defence.h"

namespace meshtrain {

nlohmann::json common_checkpoint_fields(const TrainConfig& c, const ckpt::Pin* init) {
  return {// The whole config, as `--print-config` writes it: what `meshtrain diagnose step` replays with.
          {"config_toml", print_config(c)},
          {"config", {{"model", spec_to_json(c.model)}, {"train", {{"seed", c.seed}, {"method", c.method}}}}},
          {"lora", c.lora.rank > 0 ? nlohmann::json{{"rank", c.lora.rank}, {"alpha", c.lora.alpha},
                                                    {"dropout", c.lora.dropout}, {"targets", c.lora.targets}}
                                   : nlohmann::json(nullptr)},
          // The pinned starting weights (ckpt/pin.h). Adapters on a frozen base: the checkpoint
          // holds what trains, and the base is that pinned step (ckpt::model_weights, load_model); QLoRA's in NF4.
          {"init", init ? ckpt::to_json(*init) : nlohmann::json(nullptr)},
          {"base", init && adapter_checkpoints(c) ? ckpt::to_json(*init) : nlohmann::json(nullptr)}};
}

nlohmann::json training_checkpoint_fields(const TrainConfig& c, const AdamW& opt, const TokenLoader& loader, int dp,
                                          const LossScaler* scaler, const SpikeDefence& spike, const ckpt::Pin* init) {
  const LoaderState ls = loader.state();
  nlohmann::json scaler_state = nullptr;
  if (scaler) {
    scaler_state = {{"scale", scaler->state().scale}, {"good_steps", scaler->state().good_steps},
                    {"skipped", scaler->state().skipped}};
  }
  nlohmann::json f = common_checkpoint_fields(c, init);
  f["config"]["train"].update({{"seq", c.seq}, {"micro_batch", c.micro_batch}, {"global_batch", c.global_batch},
                               {"steps", c.steps}, {"data", train_shards_of(c)}});
  f.update({{"scaler", scaler_state},
            {"spike", spike.state()},
            {"precision", c.precision},
            {"mesh", {{"tp", c.tp}, {"pp", c.pp}, {"virtual", c.virtual_stages}, {"dp", dp}, {"sp", c.sp},
                      {"cp", c.cp}, {"cp_impl", c.cp_impl}, {"zero", c.zero}, {"dp_shard", c.dp_shard}, {"ep", c.ep}}},
            {"optimizer", {{"steps", opt.steps()}}},
            {"qlora", c.lora_quantize != "none" ? nlohmann::json{{"block", 64}, {"double_quant", c.lora_double_quant}}
                                                : nlohmann::json(nullptr)},
            {"loader", {{"epoch", ls.epoch}, {"windows", ls.step * c.micro_batch * dp}}}});
  return f;
}


double max_over(Comm& group, double x) {
  at::Tensor t = at::full({1}, x, at::kDouble);
  group.all_reduce(t, ReduceOp::Max, Transport::Native);
  return t.item<double>();
}

int64_t resume_training(const TrainConfig& c, const std::string& path, TrainEngine& engine, TokenLoader& loader,
                        int dp, Comm& world, bool lead, SpikeDefence& spike, bool rollback) {
  if (path.empty()) return 0;
  ckpt::Reader r(path, c.ckpt_staging_mb << 20);
  const auto& m = r.manifest();
  const auto& t = m.at("config").at("train");
  if (t.at("seq") != c.seq || t.at("seed") != c.seed || t.at("global_batch") != c.global_batch) {
    throw std::runtime_error(fmt::format("checkpoint {} was trained with seq {}, seed {}, global batch {}; the config "
                                         "has {}, {}, {} (they must match to resume the same run; use "
                                         "checkpoint.resume = \"none\" to start afresh)",
                                         path, t.at("seq").dump(), t.at("seed").dump(), t.at("global_batch").dump(),
                                         c.seq, c.seed, c.global_batch));
  }
  const auto& mesh = m.at("mesh");
  const PeakProbe probe;
  const auto t0 = std::chrono::steady_clock::now();
  engine.load(r);
  const double extra = max_over(world, probe.extra_bytes());
  const double seconds = max_over(world, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const uint64_t windows = m.at("loader").at("windows").get<uint64_t>();
  const uint64_t per_step = static_cast<uint64_t>(c.micro_batch) * dp;
  if (windows % per_step != 0) {
    throw std::runtime_error(fmt::format("checkpoint {}: {} windows consumed is not a whole number of micro-steps of "
                                         "{} x {} ranks; resume with a micro-batch that divides it",
                                         path, windows, c.micro_batch, dp));
  }
  loader.restore({m.at("loader").at("epoch").get<uint64_t>(), windows / per_step});
  LossScaler* scaler = engine.scaler();
  if (scaler && m.contains("scaler") && !m["scaler"].is_null()) {
    scaler->restore({m["scaler"].at("scale").get<double>(), m["scaler"].at("good_steps").get<int64_t>(),
                     m["scaler"].at("skipped").get<int64_t>()});
  }
  spike.restore(m.value("spike", nlohmann::json()), rollback);
  const int64_t step = m.at("step").get<int64_t>();
  if (lead) {
    fmt::print("{}{} {} (step {}, saved on tp={} cp={} dp={} pp={} ep={}; loaded in {:.2f} s, peak extra memory "
               "{} per rank)\n",
               rollback ? fmt::format("step {:>5} | ", step) : "", rollback ? "rolled back to" : "resumed from", path,
               step, mesh["tp"].dump(), mesh.value("cp", 1), mesh["dp"].dump(), mesh.value("pp", 1), mesh.value("ep", 1),
               seconds, plan::human_bytes(extra));
  }
  return step;
}

// After a restart, rank 0 verifies and broadcasts the step it chose.
std::string resume_path(const TrainConfig& c, Comm& world, int restart) {
  if (c.resume == "none") return "";
  if (c.resume != "auto") return ckpt::resolve(c.resume);
  if (c.ckpt_dir.empty()) return "";
  if (restart == 0) {
    auto l = ckpt::latest(c.ckpt_dir);
    return l ? *l : "";
  }
  at::Tensor step = at::full({1}, int64_t{-1}, at::kLong);
  if (world.rank() == 0) {
    std::vector<std::string> skipped;
    const auto l = ckpt::latest_verified(c.ckpt_dir, &skipped);
    for (const auto& why : skipped) fmt::print("restart {}: skipping {}\n", restart, why);
    int64_t s = -1;
    if (l && ckpt::parse_step_dir(std::filesystem::path(*l).filename().string(), s)) step[0] = s;
    fmt::print("restart {}: resuming from {}\n", restart, l ? *l : "the start (no checkpoint verifies)");
  }
  world.broadcast(step, 0, Transport::Native);
  const int64_t s = step.item<int64_t>();
  return s < 0 ? "" : (std::filesystem::path(c.ckpt_dir) / ckpt::step_dir_name(s)).string();
}

std::unique_ptr<ckpt::Checkpointer> checkpoint_saver(const TrainConfig& c, Runtime& rt) {
  if (c.ckpt_dir.empty()) return nullptr;
  std::vector<int> all(static_cast<size_t>(rt.world_size()));
  for (int r = 0; r < rt.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(c.ckpt_timeout * 1000));
  return std::make_unique<ckpt::Checkpointer>(ckpt::SaveOptions{c.ckpt_dir, c.ckpt_keep, c.ckpt_async},
                                              rt.new_group(all, "checkpoint", timeout));
}

bool adapter_checkpoints(const TrainConfig& c) {
  return (c.lora.rank > 0 || c.adapters.bottleneck > 0) && !c.init_from.empty();
}

ckpt::Pin starting_weights(const TrainConfig& c, const std::string& resumed) {
  if (!resumed.empty()) {
    std::ifstream f(std::filesystem::path(resumed) / "manifest.json");
    const nlohmann::json m = nlohmann::json::parse(f, nullptr, false);
    for (const char* key : {"init", "base"}) {
      if (m.is_object() && m.contains(key) && m[key].is_object()) return ckpt::pinned(m[key], resumed);
    }
  }
  return ckpt::pin(c.init_from);  // a new run (or a checkpoint written before pins that holds no base)
}

}  // namespace meshtrain
