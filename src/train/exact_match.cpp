#include "meshtrain/train/exact_match.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <map>
#include <stdexcept>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/train/state.h"

namespace meshtrain {

std::unique_ptr<Transformer> load_for_inference(const std::string& ckpt_dir, Comm& solo, bool tiled) {
  ckpt::Reader reader(ckpt_dir);
  const auto& manifest = reader.manifest();
  if (!manifest.contains("config")) throw std::runtime_error(fmt::format("{} has no model description", ckpt_dir));
  plan::ModelSpec spec = spec_from_json(manifest["config"]["model"]);
  if (tiled) spec.attention = plan::AttentionImpl::Tiled;
  auto model = std::make_unique<Transformer>(spec, solo, false, 0);
  const auto weights = ckpt::model_weights(reader);
  at::NoGradGuard no_grad;
  for (auto& p : model->params().params()) {
    auto it = weights.find(p.name);
    if (it == weights.end()) throw std::runtime_error(fmt::format("{} holds no weight '{}'", ckpt_dir, p.name));
    // Vocabulary padding (removed by model_weights) stays zero.
    p.tensor.zero_();
    p.tensor.narrow(0, 0, it->second.size(0)).copy_(it->second);
  }
  return model;
}

ExactMatch& ExactMatch::operator+=(const ExactMatch& o) {
  answers += o.answers, exact += o.exact, targets += o.targets, correct += o.correct;
  return *this;
}

ExactMatch exact_match(Transformer& m, const Batch& b, bool document_mask) {
  if (!b.doc_ids.defined()) throw std::invalid_argument("exact_match needs the batch's documents (doc_ids)");
  at::NoGradGuard no_grad;
  const at::Tensor logits = m.logits(b.tokens, false, document_mask ? b.doc_ids : at::Tensor());  // [s, b, V_pad]
  const at::Tensor pred = logits.narrow(2, 0, m.spec().vocab).argmax(2).t().contiguous();        // [b, s]
  const at::Tensor trained = b.targets >= 0, right = (pred == b.targets) & trained;
  ExactMatch r;
  const at::Tensor doc_ids = b.doc_ids.contiguous();
  const auto doc = doc_ids.accessor<int64_t, 2>();
  const auto t = trained.accessor<bool, 2>();
  const auto ok = right.accessor<bool, 2>();
  for (int64_t row = 0; row < b.tokens.size(0); ++row) {
    std::map<int64_t, std::pair<int64_t, int64_t>> docs;  // document -> (trained, right)
    for (int64_t j = 0; j < b.tokens.size(1); ++j) {
      if (!t[row][j]) continue;
      auto& d = docs[doc[row][j]];
      d.first += 1;
      d.second += ok[row][j];
    }
    for (const auto& [id, d] : docs) {
      r.answers += 1;
      r.exact += d.first == d.second;
      r.targets += d.first;
      r.correct += d.second;
    }
  }
  return r;
}

ExactMatch exact_match(Transformer& m, const std::vector<std::string>& shards, int64_t seq, bool document_mask) {
  TokenLoader loader(shards, seq, 1, 0, 1, 1, LoaderOptions{true, true, 1});
  ExactMatch r;
  for (uint64_t i = 0; i < loader.steps_per_epoch(); ++i) r += exact_match(m, loader.next(), document_mask);
  return r;
}

}  // namespace meshtrain
