// A learned reward model (Ouyang et al., InstructGPT, arXiv 2203.02155 §3.5;
// TRL's RewardTrainer): a value model (rl/critic.h) whose score of a sequence
// is its value at the position that predicts the sequence's last token (for an
// answer ending with the end token: the state after all of its content).
// Trained on preference pairs (data/preference.h, `train.method = "reward"`)
// with the Bradley–Terry loss −log σ(r_chosen − r_rejected), a mean over
// pairs; then scores RL completions (rl.reward_model) in place of the task's
// reward, frozen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "meshtrain/train/objective.h"

namespace meshtrain {

class Comm;
class Transformer;

// Each row's score [b]: its value at its last trained target's position
// (targets [b, s], < 0 not trained; a row without one throws).
at::Tensor sequence_scores(Transformer& m, const at::Tensor& tokens, const at::Tensor& targets, bool train);

// The reward model's objective: batches from the loader with group = 2 (row
// 2i chosen, 2i+1 rejected); units are pairs. Metrics: the mean chosen and
// rejected scores, margin, accuracy (the fraction of pairs ranked right).
class RewardModelObjective : public Objective {
 public:
  double units(const Batch& b) const override;
  at::Tensor loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) override;
  std::vector<std::string> metrics() const override { return {"score/chosen", "score/rejected", "margin", "accuracy"}; }
};

// A frozen reward model from a checkpoint of train.method = "reward" (its own
// model shape, split over `tp`). Throws std::invalid_argument when the
// checkpoint has no value head.
std::unique_ptr<Transformer> load_reward_model(const std::string& dir, Comm& tp);

// Scores [R] of rows `tokens` [R, S] whose last token sits at `last` [R]
// (the value at position last - 1). No gradient.
at::Tensor score_rows(Transformer& rm, const at::Tensor& tokens, const at::Tensor& last);

}  // namespace meshtrain
