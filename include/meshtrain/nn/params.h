// Parameters with their sharding: the registry a model fills as it is built.
//
// Every parameter knows its full (unsharded) shape and how tensor parallelism
// splits it (along `tp_dim`, or replicated), so that gradients can be checked
// against one process, replicated gradients reduced, and checkpoints written
// with global shapes.
//
// Invariant (initialisation independent of tp): a parameter's full tensor is
// drawn from a generator seeded by (seed, name) and then sliced, so tp = 1 and
// tp = 4 start from identical weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace meshtrain {

enum class Init { Normal, Zeros, Ones };

struct Param {
  std::string name;          // "layers.0.attn.q.weight"
  at::Tensor tensor;         // this rank's shard (requires grad)
  std::vector<int64_t> full_shape;
  int64_t tp_dim = -1;       // dim split across tp ranks; -1: replicated
  // With sequence parallelism, a replicated parameter used on sequence shards
  // (norm weights, row-parallel biases) gets only part of its gradient on each
  // rank: the tp group must sum it (finalize_grads).
  bool sequence_partial = false;
  // Weight decay: -1 decides by name and shape (optim/adamw.h decays());
  // 0 or 1 forces it (ZeRO's flat shards, which hold many parameters).
  int decay = -1;
  // A copy of a parameter another rank owns (the tied embedding on the last
  // pipeline stage): updated like any other, but not counted in norms and not
  // written to checkpoints.
  bool replica = false;
  // Not trained (a base weight under LoRA, peft/lora.h): requires no gradient,
  // gets no optimizer state.
  bool frozen = false;
  // Expert parallelism (moe/layer.h): dim 0 indexes experts and is split
  // across the ep group; this rank holds experts [expert_offset,
  // expert_offset + tensor.size(0)). Its gradient is reduced over the ranks
  // holding the same experts (dp x cp), not over ep.
  bool expert = false;
  int64_t expert_offset = 0;
};

class ParamStore {
 public:
  ParamStore(uint64_t seed, int tp_rank, int tp_size) : seed_(seed), tp_rank_(tp_rank), tp_size_(tp_size) {}

  // Creates (full tensor from the name's generator, then this rank's slice of
  // `tp_dim`), registers and returns it. `rows_valid`: along dim 0, rows at and
  // beyond it are padding and start at zero (vocabulary padding).
  at::Tensor create(const std::string& name, std::vector<int64_t> full_shape, Init init, double std, int64_t tp_dim,
                    bool sequence_partial = false, int64_t rows_valid = -1);

  // An expert-parallel parameter: the full tensor [experts, ...] drawn as in
  // create (so ep = 1 and ep = 4 start alike), then this ep rank's experts.
  at::Tensor create_experts(const std::string& name, std::vector<int64_t> full_shape, double std, int ep_rank,
                            int ep_size, bool sequence_partial = false);

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  const Param& find(const std::string& name) const;
  int64_t local_numel() const;
  // Freezes the first `n` parameters (frozen, requires no gradient): the base
  // model under adapters (peft/), registered before them.
  void freeze_first(size_t n);
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

 private:
  uint64_t seed_;
  int tp_rank_, tp_size_;
  std::vector<Param> params_;
};

// FNV-1a: a hash of a name that is the same on every platform and run.
uint64_t stable_hash(const std::string& s);

}  // namespace meshtrain
