#include "meshtrain/rl/reward_model.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/critic.h"
#include "meshtrain/train/state.h"

namespace meshtrain {

at::Tensor sequence_scores(Transformer& m, const at::Tensor& tokens, const at::Tensor& targets, bool train) {
  const at::Tensor trained = (targets >= 0).to(at::kLong);
  if ((trained.sum(1) == 0).any().item<bool>()) {
    throw std::invalid_argument("sequence_scores: a row has no trained target (nothing to score)");
  }
  const int64_t S = tokens.size(1);
  // The last trained position: the largest index with a target.
  const at::Tensor last = (at::arange(S, at::kLong).unsqueeze(0) * trained).argmax(1);
  return values(m, tokens, train).gather(1, last.unsqueeze(1)).squeeze(1);
}

double RewardModelObjective::units(const Batch& b) const {
  if (b.tokens.size(0) % 2 != 0) {
    throw std::invalid_argument(fmt::format("a reward-model batch holds chosen/rejected pairs; it has {} rows",
                                            b.tokens.size(0)));
  }
  return static_cast<double>(b.tokens.size(0) / 2);
}

at::Tensor RewardModelObjective::loss(Transformer& m, const Batch& b, bool train, std::vector<double>& metric_sums) {
  const int64_t rows = static_cast<int64_t>(units(b)) * 2;
  const at::Tensor s = sequence_scores(m, b.tokens, b.targets, train);
  const at::Tensor chosen = s.slice(0, 0, rows, 2), rejected = s.slice(0, 1, rows, 2);
  const at::Tensor margin = chosen - rejected;
  metric_sums.at(0) += chosen.sum().item<double>();
  metric_sums.at(1) += rejected.sum().item<double>();
  metric_sums.at(2) += margin.sum().item<double>();
  metric_sums.at(3) += (margin > 0).sum().item<double>();
  return -at::log_sigmoid(margin).sum();
}

std::unique_ptr<Transformer> load_reward_model(const std::string& dir, Comm& tp) {
  ckpt::Reader r(ckpt::resolve(dir));
  if (!r.has("model/value_head.weight")) {
    throw std::invalid_argument(fmt::format("{} is not a reward model (it has no value head): train one with "
                                            "train.method = \"reward\" on preference pairs",
                                            r.dir()));
  }
  const auto& m = r.manifest();
  if (!m.contains("config") || !m["config"].contains("model")) {
    throw std::invalid_argument(fmt::format("{}: the manifest names no model shape", r.dir()));
  }
  const uint64_t seed = m["config"].contains("train") ? m["config"]["train"].value("seed", uint64_t{0}) : 0;
  auto model = std::make_unique<Transformer>(spec_from_json(m["config"]["model"]), tp, false, seed);
  add_value_head(*model);
  load_initial_weights(r, *model);
  for (auto& p : model->params().params()) p.tensor.requires_grad_(false);
  return model;
}

at::Tensor score_rows(Transformer& rm, const at::Tensor& tokens, const at::Tensor& last) {
  at::NoGradGuard no_grad;
  return values(rm, tokens, false).gather(1, (last - 1).clamp_min(0).unsqueeze(1)).squeeze(1);
}

}  // namespace meshtrain
