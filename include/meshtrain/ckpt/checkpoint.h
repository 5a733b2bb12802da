// Sharded checkpoints: one safetensors file per rank plus a manifest.
//
//   DIR/step_00000100/manifest.json
//   DIR/step_00000100/rank_00000.safetensors ...
//
// manifest.json: {"format": "meshtrain-checkpoint", "version": 1, "step",
// "world_size", the caller's global fields (config, mesh, loader, scaler, ...),
// "tensors": {name: {"dtype", "shape" (global), "shards": [{"file", "offsets",
// "shape", "xxh64"}]}}, "ranks": [per-rank state]}.
// A tensor's shards tile its global shape exactly (checked at save); replicas
// (the same shard on several data-parallel ranks) are written once.
//
// Invariant (atomicity): every file is written into DIR/.tmp-step_..-NONCE/,
// the manifest last, and the directory is renamed to step_... only when every
// rank has reported its files fsynced. A crash or a failed write therefore
// never leaves a directory that looks whole; `latest` sees only renamed ones.
//
// Protocol (collectives on the checkpoint's own group, never file polling):
// ranks agree on the nonce; each writes its shard file and a part file
// describing it; then they agree on success (every rank learns every failure,
// with its cause); rank 0 assembles the manifest from the part files, renames,
// applies retention and tells the others the outcome. A failed save removes
// its temporary directory (a full disk does not stay full) and throws on
// every rank; the previous checkpoints are untouched. Retention renames a
// checkpoint to .del-... before deleting it, so a kill midway leaves nothing
// that looks like a checkpoint; leftovers (.tmp-, .del-, .old-, step_ without
// a manifest) are swept when a Checkpointer opens the directory. Rank 0 holds
// an exclusive lock on DIR/.lock for the Checkpointer's life: a second job on
// the same directory is one error on every one of its ranks, before any file
// is touched.
//
// Async mode: save() copies this rank's tensors to host memory (the snapshot)
// and returns; a background thread writes them while training continues. At
// most one save is in flight. poll(), called by every rank once per step,
// agrees on it as soon as every rank's writer is done (one small all-reduce
// per step while a save is in flight) — or as soon as any has failed, which
// fails it on every rank at that step; save() and finish() wait for it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace meshtrain {
class Comm;
}

namespace meshtrain::ckpt {

// This rank's piece of a global tensor.
struct Piece {
  std::string name;
  at::Tensor local;                   // CPU
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;       // of `local` inside the global tensor
  bool owner = true;                  // false: a replica that another rank writes
};

struct SaveOptions {
  std::string dir;
  int keep = 2;             // newest checkpoints kept (>= 1)
  bool async = false;
};

class Checkpointer {
 public:
  // Collective over `group` (every rank that saves; its timeout is the
  // checkpoint's: a slow disk, not a lost rank). Creates the directory, takes
  // its lock (std::runtime_error on every rank when another job holds it,
  // naming its pid and host) and sweeps leftovers of crashed saves.
  Checkpointer(SaveOptions o, Comm& group);
  // The same over a group of its own, which it keeps.
  Checkpointer(SaveOptions o, std::unique_ptr<Comm> group);
  ~Checkpointer();  // joins a writer in flight; a save not agreed on is left for the next sweep

  // Collective. `global` (rank 0's is used) becomes the manifest's top-level
  // fields; `rank_state` this rank's entry of manifest["ranks"]. Throws on
  // every rank when any rank failed (this save, or the async one before it).
  void save(int64_t step, std::vector<Piece> pieces, nlohmann::json global, nlohmann::json rank_state);
  // Collective, once per step: completes an async save whose writers are all
  // done (or any failed). Returns the step it completed, or -1.
  int64_t poll();
  // Collective: waits for the save in flight and completes it.
  void finish();

 private:
  struct Pending;
  void open();  // the constructors' collective part
  void write(Pending& p, std::vector<Piece> pieces, nlohmann::json rank_state);
  void agree();  // collective: completes pending_ (or fails it on every rank)
  void finalize(const Pending& p);
  std::unique_ptr<Comm> owned_;  // declared before group_: may be what it refers to
  SaveOptions o_;
  Comm& group_;
  int lock_fd_ = -1;
  std::unique_ptr<Pending> pending_;
};

std::string step_dir_name(int64_t step);  // "step_00000100"
// "step_00000100" -> 100; false for any other name.
bool parse_step_dir(const std::string& name, int64_t& step);
// The newest complete checkpoint under `dir` (a directory holding manifest.json), if any.
std::optional<std::string> latest(const std::string& dir);
// `path` is a step directory or a directory of them: the checkpoint to load.
std::string resolve(const std::string& path);
// The newest complete checkpoint under `dir` whose every shard passes its
// checksum (verify()), if any; the newer ones that did not are appended to
// `skipped` as "DIR: first problem". After a crash, resume from this one.
std::optional<std::string> latest_verified(const std::string& dir, std::vector<std::string>* skipped = nullptr);
// Before any rank starts: `dir` can be created and written (a probe file is
// written, fsynced and removed), and no running job holds its lock (see
// Checkpointer). Throws std::invalid_argument naming the directory and the fix.
void check_directory(const std::string& dir);

// Reads a checkpoint, on any mesh: a rank asks for the box of a tensor it
// holds, and the reader assembles it from whichever shards overlap it.
class Reader {
 public:
  // Throws std::runtime_error naming the directory when the manifest is
  // missing or unreadable, or a shard file named in it is missing or short.
  // Shards are streamed through `staging_bytes` at a time (read()).
  explicit Reader(const std::string& step_dir, int64_t staging_bytes = int64_t{64} << 20);
  ~Reader();

  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  // Names asked for from now on are read as `prefix` + name: a second model
  // stored beside the first (PPO's critic under "critic/").
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  bool has(const std::string& name) const;
  std::vector<int64_t> global_shape(const std::string& name) const;

  // Fills `dst`, the box at `offsets` of a tensor whose global shape is
  // `global_shape`. The stored global shape must match, except that dim 0 may
  // differ (vocabulary padding depends on tp): rows beyond the stored extent
  // become zero. Each overlapping shard is streamed in chunks of at most the
  // staging size whose mapped pages are released once copied, so a read adds
  // at most one chunk of resident memory beyond `dst`; a shard's first read
  // covers all of it and checks its checksum (std::runtime_error when it
  // fails: `dst` is then partly written and must not be used).
  void read(const std::string& name, const at::Tensor& dst, const std::vector<int64_t>& offsets,
            const std::vector<int64_t>& global_shape);
  at::Tensor read_full(const std::string& name);

 private:
  struct Files;
  int64_t copy_shard(const std::string& name, const nlohmann::json& shard, const std::vector<int64_t>& lo,
                     const std::vector<int64_t>& len, const at::Tensor& dst, const std::vector<int64_t>& offsets);
  std::string dir_;
  nlohmann::json manifest_;
  std::unique_ptr<Files> files_;
  int64_t staging_;
  std::string prefix_;
};

// `meshtrain ckpt verify`: every shard of every tensor against its checksum.
// The manifest's tensor table checked before any file is opened or anything
// allocated (hostile or damaged manifests): "tensors" a non-empty object; each
// tensor a known dtype, a shape of non-negative sizes whose bytes fit in int64,
// and shards whose "file" is a plain name inside the step directory (no path,
// no ".."), whose offsets and shape have the tensor's rank and lie inside it,
// and which tile the tensor exactly (no overlap, no gap). Throws
// std::runtime_error naming `path`, the tensor and the field.
void validate_manifest(const nlohmann::json& manifest, const std::string& path);

struct VerifyReport {
  int64_t tensors = 0, shards = 0, bytes = 0;
  std::vector<std::string> problems;  // one line each, naming the tensor and file
};
VerifyReport verify(const std::string& step_dir);

// The model's full weights (tensors named "model/...", returned without the
// prefix; vocabulary padding removed). A LoRA checkpoint's adapters are merged
// into their base weights, W + (alpha / rank) B A with the manifest's "lora"
// settings; with `adapters_only`, the adapters alone (throws when there are none).
std::map<std::string, at::Tensor> model_weights(Reader& r, bool adapters_only = false);

// `meshtrain ckpt export`: model_weights as one safetensors file (adapters
// only: with the LoRA settings in its metadata). Refuses to replace an
// existing file unless `force`.
void export_model(const std::string& step_dir, const std::string& out, bool force, bool adapters_only = false);

}  // namespace meshtrain::ckpt
