#include "meshtrain/train/choice_eval.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <stdexcept>

#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/platform/subprocess.h"

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

std::vector<std::pair<size_t, size_t>> choice_rows(const std::vector<TokenizedChoice>& qs) {
  std::vector<std::pair<size_t, size_t>> rows;
  for (size_t i = 0; i < qs.size(); ++i) {
    for (size_t k = 0; k < qs[i].choices.size(); ++k) rows.emplace_back(i, k);
  }
  return rows;
}

void rows_from(const std::vector<TokenizedChoice>& qs, const std::vector<std::pair<size_t, size_t>>& rows, size_t begin,
               size_t end, int64_t seq, int64_t* tokens, int64_t* targets) {
  for (size_t r = begin; r < end; ++r) {
    const ChoiceRow row = choice_row(qs[rows[r].first], rows[r].second, seq);
    std::copy(row.tokens.begin(), row.tokens.end(), tokens + (r - begin) * static_cast<size_t>(seq));
    std::copy(row.targets.begin(), row.targets.end(), targets + (r - begin) * static_cast<size_t>(seq));
  }
}

ChoiceScore score_rows(const std::vector<TokenizedChoice>& qs, const std::vector<double>& row_losses) {
  ChoiceScore s;
  size_t r = 0;
  for (const auto& q : qs) {
    std::vector<double> ll;
    for (size_t k = 0; k < q.choices.size(); ++k) ll.push_back(-row_losses.at(r++));
    judge(s, q, ll);
  }
  return s;
}

void check_choice_ids(const std::vector<TokenizedChoice>& qs, int64_t vocab, const std::string& task) {
  int64_t top = 0;
  for (const auto& q : qs) {
    for (int64_t id : q.context) top = std::max(top, id);
    for (const auto& c : q.choices) {
      for (int64_t id : c) top = std::max(top, id);
    }
  }
  if (top >= vocab) {
    throw std::invalid_argument(fmt::format("{}: tokenized, it holds id {}, beyond the model's vocabulary of {}: give "
                                            "the tokenizer the model was trained with", task, top, vocab));
  }
}

std::vector<std::vector<double>> choice_loglikelihoods(Transformer& m, const std::vector<TokenizedChoice>& qs,
                                                       int64_t seq, int64_t rows) {
  const auto index = choice_rows(qs);
  std::vector<double> losses;
  at::NoGradGuard no_grad;
  for (size_t begin = 0; begin < index.size(); begin += static_cast<size_t>(rows)) {
    const size_t end = std::min(index.size(), begin + static_cast<size_t>(rows));
    const int64_t b = static_cast<int64_t>(end - begin);
    at::Tensor tokens = at::empty({b, seq}, at::kLong), targets = at::empty({b, seq}, at::kLong);
    rows_from(qs, index, begin, end, seq, tokens.data_ptr<int64_t>(), targets.data_ptr<int64_t>());
    const at::Tensor nll = m.forward(tokens, targets, false).sum(0).to(at::kDouble).contiguous();  // [s, b] -> [b]
    losses.insert(losses.end(), nll.data_ptr<double>(), nll.data_ptr<double>() + b);
  }
  std::vector<std::vector<double>> lls(qs.size());
  for (size_t r = 0; r < index.size(); ++r) lls[index[r].first].push_back(-losses[r]);
  return lls;
}

ShardLoss shard_loss(Transformer& m, const std::string& shard, int64_t seq, int64_t rows) {
  const ShardReader r(shard);
  uint32_t top = 0;
  for (uint64_t i = 0; i < r.size(); ++i) top = std::max(top, r[i]);
  if (top >= static_cast<uint32_t>(m.spec().vocab)) {
    throw std::invalid_argument(fmt::format("{} holds token id {}, beyond the model's vocabulary of {}: was it "
                                            "tokenized with another tokenizer?", shard, top, m.spec().vocab));
  }
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

std::string choice_sample_line(const std::string& task, const TokenizedChoice& q, const std::vector<double>& ll) {
  ChoiceScore alone;
  judge(alone, q, ll);
  return nlohmann::json{{"task", task},   {"line", q.line},        {"answer", q.answer},
                        {"ll", ll},       {"chars", q.chars},      {"acc", alone.correct},
                        {"acc_norm", alone.correct_norm}}
      .dump();
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
