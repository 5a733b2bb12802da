#include "meshtrain/train/choice_eval.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/runtime/subprocess.h"

namespace meshtrain {

ChoiceRow choice_row(const TokenizedChoice& q, size_t k, int64_t seq) {
  const auto& choice = q.choices.at(k);
  const int64_t n = static_cast<int64_t>(choice.size());
  if (n > seq) {
    throw std::invalid_argument(fmt::format("task line {}: choice {} has {} tokens, more than the model's sequence "
                                            "({}); shorten it", q.line, k, n, seq));
  }
  // The last seq + 1 - n context tokens (at least one: the id before the choice's first).
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(q.context.size()), seq + 1 - n);
  std::vector<int64_t> all(q.context.end() - keep, q.context.end());
  all.insert(all.end(), choice.begin(), choice.end());
  ChoiceRow r;
  r.tokens.assign(all.begin(), all.end() - 1);
  r.targets.assign(all.size() - 1, -1);
  for (int64_t i = 0; i < n; ++i) r.targets[static_cast<size_t>(keep - 1 + i)] = choice[static_cast<size_t>(i)];
  // Padding: the first token again (never a target; causal attention keeps it from the choice).
  r.tokens.resize(static_cast<size_t>(seq), q.context.front());
  r.targets.resize(static_cast<size_t>(seq), -1);
  return r;
}

void judge(ChoiceScore& s, const TokenizedChoice& q, const std::vector<double>& ll) {
  if (ll.size() != q.choices.size()) throw std::invalid_argument("judge: one log-likelihood per choice");
  size_t best = 0, best_norm = 0;
  for (size_t k = 1; k < ll.size(); ++k) {
    if (ll[k] > ll[best]) best = k;
    if (ll[k] / static_cast<double>(q.chars[k]) > ll[best_norm] / static_cast<double>(q.chars[best_norm])) best_norm = k;
  }
  s.questions += 1;
  s.answer_ll += ll[static_cast<size_t>(q.answer)];
  s.correct += static_cast<int64_t>(best) == q.answer;
  s.correct_norm += static_cast<int64_t>(best_norm) == q.answer;
}

std::vector<std::vector<double>> choice_loglikelihoods(Transformer& m, const std::vector<TokenizedChoice>& qs,
                                                       int64_t seq, int64_t rows) {
  std::vector<std::pair<size_t, size_t>> index;  // (question, choice) of each row
  std::vector<std::vector<double>> lls(qs.size());
  for (size_t i = 0; i < qs.size(); ++i) {
    lls[i].resize(qs[i].choices.size());
    for (size_t k = 0; k < qs[i].choices.size(); ++k) index.emplace_back(i, k);
  }
  at::NoGradGuard no_grad;
  for (size_t begin = 0; begin < index.size(); begin += static_cast<size_t>(rows)) {
    const size_t end = std::min(index.size(), begin + static_cast<size_t>(rows));
    const int64_t b = static_cast<int64_t>(end - begin);
    at::Tensor tokens = at::empty({b, seq}, at::kLong), targets = at::empty({b, seq}, at::kLong);
    for (size_t r = begin; r < end; ++r) {
      const ChoiceRow row = choice_row(qs[index[r].first], index[r].second, seq);
      const int64_t at_row = static_cast<int64_t>(r - begin);
      std::copy(row.tokens.begin(), row.tokens.end(), tokens[at_row].data_ptr<int64_t>());
      std::copy(row.targets.begin(), row.targets.end(), targets[at_row].data_ptr<int64_t>());
    }
    const at::Tensor nll = m.forward(tokens, targets, false).sum(0).to(at::kDouble);  // [s, b] -> [b]
    for (size_t r = begin; r < end; ++r) lls[index[r].first][index[r].second] = -nll[static_cast<int64_t>(r - begin)].item<double>();
  }
  return lls;
}

ShardLoss shard_loss(Transformer& m, const std::string& shard, int64_t seq, int64_t rows) {
  const ShardReader r(shard);
  const int64_t windows = static_cast<int64_t>((r.size() - 1) / static_cast<uint64_t>(seq));
  if (windows < 1) throw std::invalid_argument(fmt::format("{} holds fewer than {} tokens: no window", shard, seq + 1));
  ShardLoss l;
  at::NoGradGuard no_grad;
  for (int64_t w = 0; w < windows; w += rows) {
    const int64_t b = std::min(rows, windows - w);
    at::Tensor buf = at::empty({b, seq + 1}, at::kLong);
    for (int64_t i = 0; i < b; ++i) r.read(static_cast<uint64_t>((w + i) * seq), static_cast<uint64_t>(seq + 1), buf[i].data_ptr<int64_t>());
    const at::Tensor tokens = buf.narrow(1, 0, seq).contiguous(), targets = buf.narrow(1, 1, seq).contiguous();
    l.sum += m.forward(tokens, targets, false).sum().item<double>();
    l.tokens += b * seq;
    l.windows += b;
  }
  return l;
}

ChoiceScore score_choices(const std::vector<TokenizedChoice>& qs, const std::vector<std::vector<double>>& lls) {
  ChoiceScore s;
  for (size_t i = 0; i < qs.size(); ++i) judge(s, qs[i], lls.at(i));
  return s;
}

std::vector<TokenizedChoice> tokenize_choice_task(const std::string& task, const std::string& tokenizer,
                                                  const std::string& helper) {
  read_choice_task(task);  // its errors here, naming file:line, before the helper runs
  return parse_tokenized_choices(capture_output({helper.empty() ? helper_path("meshtrain-tokenize") : helper, "choices",
                                                 "--input", task, "--tokenizer", tokenizer}));
}

std::string run_tokenizer(const std::string& given, const std::vector<std::string>& train_shards) {
  namespace fs = std::filesystem;
  if (!given.empty()) {
    if (!fs::is_regular_file(given)) throw std::invalid_argument(fmt::format("tokenizer {} does not exist", given));
    return given;
  }
  if (train_shards.empty()) {
    throw std::invalid_argument("no tokenizer: the run names no training data; give the SentencePiece model");
  }
  const std::string beside = (fs::path(train_shards[0]).parent_path() / "tokenizer.model").string();
  if (!fs::is_regular_file(beside)) {
    throw std::invalid_argument(fmt::format("no tokenizer at {} (beside the training data); give the SentencePiece "
                                            "model that tokenized it", beside));
  }
  return beside;
}

}  // namespace meshtrain
