// What a training run (train/trainer.h) runs on this rank, built from the
// config: the model (or this pipeline rank's chunks), the data-parallel wrapper
// (none, DDP or ZeRO), the optimizer and the step, on the dp x cp x tp x pp
// (x ep) mesh; with the checkpoint pieces and loading that fit them.
//
// Expert parallelism (parallel.ep > 1; the mesh must have built the groups of
// mesh_groups()): ep ranks read different data, so the dense parameters'
// replicas are dp x cp x ep and the experts' dp x cp (moe/layer.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/loss_scaler.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/parallel/pipeline/executor.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/fp8_training.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/objective.h"
#include "meshtrain/train/pipeline_prediction.h"
#include "meshtrain/train/pipeline_step.h"
#include "meshtrain/train/state.h"
#include "meshtrain/train/step.h"

namespace meshtrain {

// What the method's data needs from the loader: documents for the mask, loss
// masks for SFT and DPO, pairs kept together for DPO.
LoaderOptions loader_options(const TrainConfig& c);
// The run's training windows (data.train, or data.sources' mixture) for data-parallel rank `rank` of `size`.
TokenLoader train_loader(const TrainConfig& c, int rank, int size, LoaderOptions o);
inline TokenLoader train_loader(const TrainConfig& c, int rank, int size) {
  return train_loader(c, rank, size, loader_options(c));
}

// The combined groups a run's mesh builds (runtime/mesh.h): dp x cp, and with
// expert parallelism dp x cp x ep (the dense gradients) and dp x ep (the data).
std::vector<std::vector<std::string>> mesh_groups(const TrainConfig& c);
// The group gradients of dense parameters and the loss normaliser are summed
// over, and the one whose ranks read different data (the loader's replicas).
Comm& dense_group(const TrainConfig& c, DeviceMesh& mesh);
Comm& data_group(const TrainConfig& c, DeviceMesh& mesh);

// What the engine trains: the config's method on its model, or (PPO) a
// critic: the model with a value head (rl/critic.h) and the value objective.
enum class EngineRole { Method, Critic };

class TrainEngine {
 public:
  // `accumulation`: micro-batches per step on each data-parallel rank (the
  // pipeline's M). Prints what it built on `lead`. `c` must outlive the engine.
  TrainEngine(const TrainConfig& c, Runtime& rt, DeviceMesh& mesh, int64_t accumulation, bool lead,
              EngineRole role = EngineRole::Method);

  // `gate`: asked before the update (train/step.h).
  // `step`: the optimizer step's number, which keys the dropout masks (model/transformer.h).
  StepResult step(int64_t step, const std::vector<Batch>& micro, const UpdateGate& gate = {});
  // One batch evaluated (forward only, no dropout), on every rank: {summed
  // loss, units, then each of the objective's metrics summed over the units}.
  std::vector<double> evaluate(const Batch& b);
  // One batch forward only, on every rank: each row's per-token loss summed
  // [b] (double). With context parallelism each cp rank's covers its chunks.
  at::Tensor row_losses(const Batch& b);
  // The method's objective (train/objective.h, from its train/method.h entry).
  Objective& objective() { return *objective_; }

  // This rank's pieces, its place among the replicas taken from the engine's own groups.
  // `trained_only`: frozen parameters left out (adapter checkpoints, trainer.h).
  std::vector<ckpt::Piece> pieces(bool trained_only = false);
  // Parameters and moments from `r`, whatever mesh wrote it. Returns the optimizer step.
  int64_t load(ckpt::Reader& r);
  // The parameters only (optimizer untouched): [init] from.
  void load_weights(ckpt::Reader& r);
  // The frozen reference (reference()), if any: the starting weights [init]
  // from, pinned (ckpt/pin.h); without a call it keeps the seed's.
  void load_reference(ckpt::Reader& r);
  // QLoRA (peft/qlora.h): the block linears into NF4. Returns their bytes.
  int64_t quantize_base();

  AdamW& optimizer() { return *opt_; }
  // The parameters of this rank's chunks, in model order (whole under DDP and ZeRO-1/2).
  std::vector<Param> model_params();
  // The model (without pipeline parallelism): what rollouts generate with.
  Transformer& model() { return *chunks_.at(0); }
  // The frozen copy of the starting weights (DPO's and GRPO's reference,
  // PPO's for the KL penalty), or null (none, or the policy with LoRA off).
  Transformer* reference() { return reference_.get(); }
  LossScaler* scaler() { return scaler_.get(); }
  Fp8Training* fp8() { return fp8_.get(); }
  int64_t local_params() const;
  std::string memory_report(int dp_size, const std::string& precision);
  MemoryUse measure();
  // Layers of each of this rank's chunks.
  std::vector<plan::StageRange> stage_layers() const;
  // The rows one MoE dispatch moved to and from other ep ranks, the mean over
  // this rank's MoE layers and forwards so far (plan/traffic.h); -1 without.
  double moe_remote_rows() const;
  // The groups behind each axis, for counters: tp, cp, pp, dp (with ZeRO's shard
  // and replica groups), embedding.
  std::map<std::string, std::vector<Comm*>> groups();
  // Per axis of groups(), the seconds this rank has spent blocked in its collectives so far
  // (Comm::blocked_seconds: on CPU the communication no compute hid); a step's is a difference.
  std::map<std::string, double> blocked_seconds();
  // Pipeline: this rank's wait in receives during the last step, and the
  // schedule's predicted bubble fraction; {0, 0} without pp.
  std::pair<double, double> bubble() const;

 private:
  const TrainConfig& c_;
  Comm& tp_;
  Comm& pp_;
  Comm& cp_;
  Comm& dp_;         // the dense parameters' replicas: dp x cp (x ep)
  Comm& expert_dp_;  // the experts' replicas: dp x cp
  Comm& ep_;
  std::vector<std::unique_ptr<Transformer>> chunks_;
  std::unique_ptr<Comm> embed_;
  ShardGroups shard_groups_;
  std::vector<std::unique_ptr<ShardedDataParallel>> zero_;
  std::unique_ptr<DataParallel> ddp_, ddp_experts_;
  std::vector<Param> dense_, experts_;  // with expert parallelism: what each DDP reduces
  std::vector<Param> updated_;  // what AdamW updates, chunk after chunk
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<PipelineExecutor> exec_;
  double predicted_bubble_ = 0;
  PipelinePrediction pipeline_prediction_;  // pp > 1: the cut's stage work and rank 0's bubble
  std::string pipeline_note_;               // compute_balance_note, or empty
  std::unique_ptr<Transformer> reference_;  // a frozen copy of the starting weights (reference())
  std::unique_ptr<Objective> objective_;
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<PipelineTrainStep> pipeline_step_;
  std::unique_ptr<Fp8Training> fp8_;  // train.precision = fp8
  Precision precision_;

  // Chunk `chunk`'s ZeRO slices (weights only when asked), its moments from
  // the optimizer's lists at k (advanced past them).
  ZeroSlices zero_slices(size_t chunk, size_t& k, bool weights);
};

}  // namespace meshtrain
