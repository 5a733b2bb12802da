#include "meshtrain/parallel/pipeline/executor.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/nn/linear.h"
#include "meshtrain/plan/partition.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain {

std::vector<std::unique_ptr<Transformer>> build_stages(const plan::ModelSpec& spec, Comm& tp, bool sequence_parallel,
                                                       uint64_t seed, int pp_rank, int pp, int v,
                                                       const std::vector<int64_t>& layers_per_stage,
                                                       plan::Balance balance, Comm* ep) {
  const int stages = pp * v;
  const auto ranges = plan::partition_layers(spec, stages, layers_per_stage, balance);
  std::vector<std::unique_ptr<Transformer>> out;
  for (int c = 0; c < v; ++c) {
    const int s = c * pp + pp_rank;
    out.push_back(std::make_unique<Transformer>(spec, tp, sequence_parallel, seed,
                                                StagePart{ranges[s].first, ranges[s].last, s == 0, s == stages - 1},
                                                ep));
  }
  return out;
}

std::unique_ptr<Comm> make_embedding_group(Runtime& rt, const MeshLayout& layout) {
  const int pp = layout.size("pp");
  if (pp == 1) return nullptr;
  const std::vector<int> stages = layout.slice(rt.rank(), {"pp"});
  const int stage = layout.coord(rt.rank(), "pp");
  if (stage != 0 && stage != pp - 1) return nullptr;
  return rt.new_group({stages.front(), stages.back()}, "embedding");
}

PipelineExecutor::PipelineExecutor(const plan::PipelineSchedule& schedule, std::vector<Transformer*> chunks, Comm& pp,
                                   std::vector<int64_t> activation, Comm* embedding_group)
    : s_(schedule), chunks_(std::move(chunks)), pp_(pp), shape_(std::move(activation)), embed_group_(embedding_group) {
  if (pp.size() != s_.pp) {
    throw std::invalid_argument(fmt::format("pipeline group has {} ranks, the schedule {}", pp.size(), s_.pp));
  }
  if (static_cast<int>(chunks_.size()) != s_.virtual_stages) {
    throw std::invalid_argument(fmt::format("{} model chunks on this rank, the schedule has {} virtual stages",
                                            chunks_.size(), s_.virtual_stages));
  }
  plan::simulate(s_);  // refuse a broken schedule before any rank sends anything
}

double PipelineExecutor::run(const std::vector<Batch>& micro, double tokens) {
  if (static_cast<int>(micro.size()) != s_.micro) {
    throw std::invalid_argument(fmt::format("{} micro-batches given, the schedule has {}", micro.size(), s_.micro));
  }
  const int rank = pp_.rank(), S = s_.stages();
  auto tag = [&](int kind, int m, int stage) { return (stage * s_.micro + m) * 2 + kind; };
  using Key = std::pair<int, int>;  // (micro, stage)
  std::map<Key, at::Tensor> inputs, outputs, acts, grads;
  std::map<Key, nn::WeightGradStash> weight_grads;  // split backward: what W computes
  std::vector<CommWork> sends;
  std::vector<at::Tensor> in_flight;  // tensors being sent stay alive until their send completes
  double loss = 0;
  wait_s_ = 0;
  for (const plan::Action& a : s_.ranks[rank]) {
    const Key key{a.micro, a.stage};
    switch (a.op) {
      case plan::Op::RecvAct:
      case plan::Op::RecvGrad: {
        at::Tensor buf = at::empty(shape_, at::kFloat);
        const auto t0 = std::chrono::steady_clock::now();
        pp_.recv(buf, a.peer, tag(a.op == plan::Op::RecvAct ? 0 : 1, a.micro, a.stage));
        wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // An activation of stage s feeds stage s + 1; a gradient of stage s + 1 feeds stage s.
        if (a.op == plan::Op::RecvAct) acts[{a.micro, a.stage + 1}] = buf;
        else grads[{a.micro, a.stage - 1}] = buf;
        break;
      }
      case plan::Op::Forward: {
        Transformer& chunk = *chunks_.at(a.stage / s_.pp);
        at::Tensor in = a.stage == 0 ? micro[a.micro].tokens : acts.at(key).requires_grad_(true);
        acts.erase(key);
        std::optional<nn::DeferWeightGrads> split;  // linears build nodes whose dW can wait for W
        if (s_.split_backward) split.emplace();
        chunk.set_dropout_rows(micro[a.micro].first_row);
        at::Tensor out = chunk.stage_forward(in, micro[a.micro].targets);
        if (a.stage == S - 1) {
          out = out.sum() / tokens;
          loss += out.item<double>();
        }
        inputs[key] = in;
        outputs[key] = out;
        break;
      }
      case plan::Op::SendAct: {
        at::Tensor out = outputs.at(key).detach().contiguous();
        in_flight.push_back(out);
        sends.push_back(pp_.isend(out, a.peer, tag(0, a.micro, a.stage)));
        break;
      }
      case plan::Op::Backward: {
        at::Tensor out = outputs.at(key);
        at::Tensor g = a.stage == S - 1 ? at::Tensor() : grads.at(key);
        // B of a split backward: the linears record (x, dy) for W instead of computing dW
        // (norm, bias and embedding gradients, being cheap, are computed now).
        std::optional<nn::WeightGradTarget> split;
        if (s_.split_backward) split.emplace(&weight_grads[key]);
        torch::autograd::backward({out}, {g});
        grads.erase(key);
        outputs.erase(key);
        if (a.stage == 0) inputs.erase(key);
        break;
      }
      case plan::Op::BackwardWeight: {
        // W: the linears' weight gradients of this (micro-batch, stage), dW = dyᵀ x.
        weight_grads.at(key).run();
        weight_grads.erase(key);
        break;
      }
      case plan::Op::SendGrad: {
        at::Tensor g = inputs.at(key).grad().contiguous();
        inputs.erase(key);
        in_flight.push_back(g);
        sends.push_back(pp_.isend(g, a.peer, tag(1, a.micro, a.stage)));
        break;
      }
    }
  }
  for (auto& w : sends) w.wait();
  if (finalize_) {
    for (Transformer* c : chunks_) c->finalize_grads();
  }
  if (embed_group_ && embed_group_->size() > 1 && chunks_.front()->spec().tied) {
    for (Transformer* c : chunks_) {
      for (auto& p : c->params().params()) {
        if (p.name != "embed.weight") continue;
        if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
        embed_group_->all_reduce(p.tensor.mutable_grad());
      }
    }
  }
  at::Tensor l = at::tensor({loss}, at::kDouble);
  pp_.all_reduce(l);  // only the last stage has a nonzero loss
  return l.item<double>();
}

void PipelineExecutor::forward_only(const Batch& b, const std::function<void(const at::Tensor&)>& on_loss) {
  at::NoGradGuard no_grad;
  const int rank = pp_.rank(), S = s_.stages(), P = s_.pp;
  std::vector<CommWork> sends;
  std::vector<at::Tensor> in_flight;  // alive until sent
  for (int s = 0; s < S; ++s) {
    if (s % P != rank) continue;
    at::Tensor in = b.tokens;
    if (s > 0) {
      in = at::empty(shape_, at::kFloat);
      pp_.recv(in, (s - 1) % P, s);
    }
    at::Tensor out = chunks_.at(s / P)->stage_forward(in, b.targets, false);
    if (s == S - 1) {
      on_loss(out);
    } else {
      in_flight.push_back(out.contiguous());
      sends.push_back(pp_.isend(in_flight.back(), (s + 1) % P, s + 1));
    }
  }
  for (auto& w : sends) w.wait();
}

double PipelineExecutor::evaluate(const std::vector<Batch>& micro) {
  double loss = 0;
  for (const Batch& b : micro) forward_only(b, [&](const at::Tensor& out) { loss += out.sum().item<double>(); });
  at::Tensor l = at::tensor({loss}, at::kDouble);
  pp_.all_reduce(l);  // only the last stage has a nonzero loss
  return l.item<double>();
}

at::Tensor PipelineExecutor::row_losses(const Batch& b) {
  at::Tensor rows = at::zeros({b.tokens.size(0)}, at::kDouble);
  forward_only(b, [&](const at::Tensor& out) { rows = out.sum(0).to(at::kDouble); });  // [s, b] -> [b]
  pp_.all_reduce(rows);  // only the last stage's are nonzero
  return rows;
}

}  // namespace meshtrain
