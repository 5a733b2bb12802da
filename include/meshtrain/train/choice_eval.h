// Multiple-choice evaluation by log-likelihood (tasks: data/choice_task.h), as
// EleutherAI's lm-evaluation-harness scores HellaSwag or ARC: each choice's
// log-likelihood as the continuation of its context, ll = sum over the
// choice's tokens of log p(token | everything before it);
//   acc       the answer has the largest ll,
//   acc_norm  the answer has the largest ll / (the choice's length in characters)
// (lm_eval/api/task.py, process_results of multiple_choice: argmax, so a tie
// goes to the first choice). Length normalisation keeps long choices, which
// have more tokens to pay for, from losing by their length alone. Beside them,
// the answers' mean log-likelihood: a smooth signal where a small model's
// accuracy still moves in steps of one question.
//
// Each choice is one row of `seq` positions: the context and the choice, the
// context cut on the left when they do not fit in seq + 1 tokens (the
// harness's truncation), padding after; targets are -1 except at the choice's
// tokens, so a row's summed per-token loss is -ll.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/choice_task.h"

namespace meshtrain {

class Transformer;

struct ChoiceScore {
  int64_t questions = 0, correct = 0, correct_norm = 0;
  double answer_ll = 0;  // summed over the questions
  double mean_answer_ll() const { return questions ? answer_ll / static_cast<double>(questions) : 0; }
  double acc() const { return questions ? static_cast<double>(correct) / static_cast<double>(questions) : 0; }
  double acc_norm() const { return questions ? static_cast<double>(correct_norm) / static_cast<double>(questions) : 0; }
};

struct ChoiceRow {
  std::vector<int64_t> tokens, targets;  // seq each
};
// Choice `k` of `q`. Throws std::invalid_argument (naming the task's line)
// when the choice alone does not fit: more than seq tokens.
ChoiceRow choice_row(const TokenizedChoice& q, size_t k, int64_t seq);

// Adds question `q` judged from its choices' log-likelihoods `ll`.
void judge(ChoiceScore& s, const TokenizedChoice& q, const std::vector<double>& ll);

// Every (question, choice) of `qs` as one row each, in order: what the
// scorers batch. rows_from writes rows [begin, end) of them into
// `tokens` and `targets` (each (end - begin) x seq, row-major).
std::vector<std::pair<size_t, size_t>> choice_rows(const std::vector<TokenizedChoice>& qs);
void rows_from(const std::vector<TokenizedChoice>& qs, const std::vector<std::pair<size_t, size_t>>& rows, size_t begin,
               size_t end, int64_t seq, int64_t* tokens, int64_t* targets);
// The score from every row's summed loss (-ll), in choice_rows' order.
ChoiceScore score_rows(const std::vector<TokenizedChoice>& qs, const std::vector<double>& row_losses);

// Throws std::invalid_argument when a task's ids do not fit the model's
// vocabulary (a tokenizer other than the model's), naming the task and the fix.
void check_choice_ids(const std::vector<TokenizedChoice>& qs, int64_t vocab, const std::string& task);

// Every choice's log-likelihood with a whole model in this process (tp = 1),
// `rows` choices per forward.
std::vector<std::vector<double>> choice_loglikelihoods(Transformer& m, const std::vector<TokenizedChoice>& qs,
                                                       int64_t seq, int64_t rows = 16);
ChoiceScore score_choices(const std::vector<TokenizedChoice>& qs, const std::vector<std::vector<double>>& lls);

// Every question's scores as a JSON line (`meshtrain eval --log-samples`, as lm-evaluation-
// harness's --log_samples): {"task", "line", "answer", "ll": [per choice], "chars": [per choice],
// "acc", "acc_norm"} (acc and acc_norm 1 or 0: this question judged alone).
std::string choice_sample_line(const std::string& task, const TokenizedChoice& q, const std::vector<double>& ll);

// The mean next-token loss of a whole model (tp = 1) over every window of
// `seq` + 1 tokens of a shard (data/loader.h's windows, in order), the loss
// `meshtrain train` reports for data.val: perplexity = exp(mean).
struct ShardLoss {
  double sum = 0;
  int64_t tokens = 0, windows = 0;
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0; }
};
ShardLoss shard_loss(Transformer& m, const std::string& shard, int64_t seq, int64_t rows = 8);

// `task` checked (read_choice_task: errors name file:line) and tokenized by
// meshtrain-tokenize (`helper`; "": the one beside this program) with
// `tokenizer` (a SentencePiece model).
std::vector<TokenizedChoice> tokenize_choice_task(const std::string& task, const std::string& tokenizer,
                                                  const std::string& helper = "");

// The tokenizer of a run: `given`, else tokenizer.model beside the first
// training shard (where meshtrain tokenize writes it). Throws naming where it
// looked and the fix.
std::string run_tokenizer(const std::string& given, const std::vector<std::string>& train_shards);

}  // namespace meshtrain
