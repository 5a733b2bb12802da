// A training run's checkpoints, for the loops that save and resume them (train/trainer.h and
// rl/rl_trainer.h): which checkpoint to resume from, the pinned starting weights, the saver,
// what a manifest holds besides the tensors (train/state.h), and loading one back into the
// engine, the loader and the spike defence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "meshtrain/ckpt/pin.h"

namespace meshtrain {
namespace ckpt {
class Checkpointer;
}

class AdamW;
class Comm;
class LossScaler;
class Runtime;
class SpikeDefence;
class TokenLoader;
class TrainEngine;
struct TrainConfig;

// Whether the run's checkpoints hold only what trains: adapters (LoRA or
// bottleneck) on a frozen base that [init] from names (small checkpoints; the
// base is loaded from there again on resume and export).
bool adapter_checkpoints(const TrainConfig& c);

// The checkpoint to resume from ("" to start afresh): checkpoint.resume's
// choice; after a restart (the launcher's --max-restarts) the newest one that
// verifies: rank 0 checks every shard's checksum, newest first, and tells the
// others which (a crash may have hit the disk, not only the process). Collective
// after a restart.
std::string resume_path(const TrainConfig& c, Comm& world, int restart);

// The starting weights of a run with [init] from, pinned (ckpt/pin.h): a
// resumed run's are its checkpoint's pin, checked against the disk (a base
// that moved or changed is one error naming both); a new run pins init.from now.
ckpt::Pin starting_weights(const TrainConfig& c, const std::string& resumed);

// The manifest fields every training checkpoint holds, whatever its method (train/state.h):
// the config (its TOML, the model, seed and method), LoRA's settings, the pinned starting
// weights and, for adapters on a frozen base, that base. Each trainer adds its own.
nlohmann::json common_checkpoint_fields(const TrainConfig& c, const ckpt::Pin* init);

// The fields train()'s checkpoints add to those: the batch and data, the loss scaler, the spike
// defence, precision, the mesh (`dp` data-parallel ranks), the optimizer's and the loader's position.
nlohmann::json training_checkpoint_fields(const TrainConfig& c, const AdamW& opt, const TokenLoader& loader, int dp,
                                          const LossScaler* scaler, const SpikeDefence& spike, const ckpt::Pin* init);

// The run's checkpoint saver (null without checkpoint.dir), over a group of
// all ranks of its own whose collectives wait checkpoint.timeout seconds.
// Collective.
std::unique_ptr<ckpt::Checkpointer> checkpoint_saver(const TrainConfig& c, Runtime& rt);

// Loads train()'s checkpoint at `path` into the engine, the loader (which must be of `dp` data
// ranks) and the spike defence, and returns its step (0 for path ""). A checkpoint of another
// seq, seed or global batch is one error. `rollback`: a spike's rollback within the run. `lead`
// prints what was loaded, with the time and the peak extra memory of the slowest rank. Collective.
int64_t resume_training(const TrainConfig& c, const std::string& path, TrainEngine& engine, TokenLoader& loader,
                        int dp, Comm& world, bool lead, SpikeDefence& spike, bool rollback);

// The largest of every rank's `x` (a checkpoint's seconds and extra bytes as the slowest rank
// saw them). Collective.
double max_over(Comm& group, double x);

}  // namespace meshtrain
