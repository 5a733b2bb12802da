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
// the manifest last, and the directory is renamed to step_... only when all
// ranks' files are fsynced. A crash or a failed write therefore never leaves a
// directory that looks whole; `latest` sees only renamed ones. After a save the
// newest `keep` checkpoints remain.
//
// Async mode: save() copies this rank's tensors to host memory (the snapshot)
// and returns; a background thread writes them while training continues. At
// most one save is in flight: the next save() first waits for the previous one.
// The ranks do not synchronise in the background: each writes a small part
// file when its tensors are on disk, and rank 0 assembles the manifest once all
// parts exist.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
  double timeout_s = 600;   // rank 0 waits this long for the other ranks' files
};

class Checkpointer {
 public:
  // `world`: every rank that saves (a collective is used to agree on a nonce).
  Checkpointer(SaveOptions o, Comm& world);
  ~Checkpointer();  // waits for a save in flight (its error is printed)

  // Collective. `global` (rank 0's is used) becomes the manifest's top-level
  // fields; `rank_state` this rank's entry of manifest["ranks"].
  void save(int64_t step, std::vector<Piece> pieces, nlohmann::json global, nlohmann::json rank_state);
  // Blocks until this rank's part of the save in flight is done (on rank 0: the
  // whole checkpoint); rethrows its error. save() and the destructor call it.
  void wait();

 private:
  void write(int64_t step, const std::string& tmp, std::vector<Piece> pieces, nlohmann::json global,
             nlohmann::json rank_state);
  void finalize(int64_t step, const std::string& tmp, nlohmann::json global);
  SaveOptions o_;
  Comm& world_;
  std::thread thread_;
  std::exception_ptr error_;
};

std::string step_dir_name(int64_t step);  // "step_00000100"
// The newest complete checkpoint under `dir` (a directory holding manifest.json), if any.
std::optional<std::string> latest(const std::string& dir);
// `path` is a step directory or a directory of them: the checkpoint to load.
std::string resolve(const std::string& path);

// Reads a checkpoint, on any mesh: a rank asks for the box of a tensor it
// holds, and the reader assembles it from whichever shards overlap it.
class Reader {
 public:
  // Throws std::runtime_error naming the directory when the manifest is
  // missing or unreadable, or a shard file named in it is missing or short.
  explicit Reader(const std::string& step_dir);
  ~Reader();

  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  std::vector<int64_t> global_shape(const std::string& name) const;

  // Fills `dst`, the box at `offsets` of a tensor whose global shape is
  // `global_shape`. The stored global shape must match, except that dim 0 may
  // differ (vocabulary padding depends on tp): rows beyond the stored extent
  // become zero. Every shard read is checked against its checksum first.
  void read(const std::string& name, const at::Tensor& dst, const std::vector<int64_t>& offsets,
            const std::vector<int64_t>& global_shape);
  at::Tensor read_full(const std::string& name);

 private:
  struct Files;
  std::string dir_;
  nlohmann::json manifest_;
  std::unique_ptr<Files> files_;
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
