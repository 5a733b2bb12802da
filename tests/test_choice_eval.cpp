// Multiple-choice scoring (train/choice_eval.h): the harness's scores equal a
// hand computation on a two-question task with a tiny model, and
// meshtrain-tokenize splits context and choices as lm-evaluation-harness does.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/comm/comm.h"
#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/platform/subprocess.h"
#include "meshtrain/train/choice_eval.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

// log p(choice | context) by hand: one forward of exactly the question's
// tokens (no padding, no batching, no truncation unless it must), the log-softmax
// of the logits, the choice's tokens picked one by one.
double hand_loglikelihood(Transformer& m, const TokenizedChoice& q, size_t k, int64_t seq) {
  std::vector<int64_t> all = q.context;
  all.insert(all.end(), q.choices[k].begin(), q.choices[k].end());
  if (static_cast<int64_t>(all.size()) > seq + 1) all.erase(all.begin(), all.end() - (seq + 1));  // keep the last seq + 1
  const int64_t n = static_cast<int64_t>(all.size()) - 1;
  at::NoGradGuard no_grad;
  const at::Tensor input = at::tensor(std::vector<int64_t>(all.begin(), all.end() - 1), at::kLong).view({1, n});
  const at::Tensor logp = m.logits(input).narrow(2, 0, m.spec().vocab).log_softmax(2);  // [n, 1, V]
  double ll = 0;
  const int64_t first = n - static_cast<int64_t>(q.choices[k].size());  // the position that predicts the first choice token
  for (size_t i = 0; i < q.choices[k].size(); ++i) {
    ll += logp[first + static_cast<int64_t>(i)][0][q.choices[k][i]].item<double>();
  }
  return ll;
}

TEST(ChoiceEval, ScoresEqualAHandComputation) {
  plan::ModelSpec spec = plan::preset("gpt-tiny");
  spec.layers = 2;
  spec.vocab = 64;
  spec.dropout = 0;
  spec.seq = 16;
  Comm solo("tp", 0);
  Transformer m(spec, solo, false, 7);
  // Question 1: three choices of 1, 3 and 2 tokens. Question 2: its context is longer than the model's
  // sequence (cut on the left), and its second choice is 1000 characters long on paper, so its ll per
  // character is about 0 and acc_norm must pick it, whatever acc picks.
  TokenizedChoice q1{{2, 10, 11, 12}, {{20}, {21, 22, 23}, {24, 25}}, {3, 9, 6}, 0, 1};
  std::vector<int64_t> long_context{2};
  for (int64_t i = 0; i < 30; ++i) long_context.push_back(30 + i % 20);
  TokenizedChoice q2{long_context, {{40, 41}, {42}}, {8, 1000}, 1, 2};
  const std::vector<TokenizedChoice> qs{q1, q2};
  const auto lls = choice_loglikelihoods(m, qs, spec.seq, 3);  // 3 rows per forward: the two questions share one
  ChoiceScore hand;
  for (size_t i = 0; i < qs.size(); ++i) {
    ASSERT_EQ(lls[i].size(), qs[i].choices.size());
    size_t best = 0, best_norm = 0;
    std::vector<double> ll;
    for (size_t k = 0; k < qs[i].choices.size(); ++k) {
      ll.push_back(hand_loglikelihood(m, qs[i], k, spec.seq));
      EXPECT_NEAR(lls[i][k], ll[k], 1e-4 * std::abs(ll[k])) << "question " << i << " choice " << k;
      EXPECT_LT(ll[k], 0);
      if (ll[k] > ll[best]) best = k;
      if (ll[k] / static_cast<double>(qs[i].chars[k]) > ll[best_norm] / static_cast<double>(qs[i].chars[best_norm])) {
        best_norm = k;
      }
    }
    hand.questions += 1;
    hand.correct += static_cast<int64_t>(best) == qs[i].answer;
    hand.correct_norm += static_cast<int64_t>(best_norm) == qs[i].answer;
    hand.answer_ll += ll[static_cast<size_t>(qs[i].answer)];
  }
  const ChoiceScore s = score_choices(qs, lls);
  EXPECT_EQ(s.questions, 2);
  EXPECT_EQ(s.correct, hand.correct);
  EXPECT_EQ(s.correct_norm, hand.correct_norm);
  EXPECT_NEAR(s.answer_ll, hand.answer_ll, 1e-4 * std::abs(hand.answer_ll));
  EXPECT_GE(s.correct_norm, 1);  // question 2's acc_norm is right by construction
  // A row: the context's last tokens, the choice as the only targets.
  const ChoiceRow row = choice_row(q2, 0, spec.seq);
  EXPECT_EQ(row.tokens.size(), 16u);
  EXPECT_EQ(row.tokens[14], long_context.back());  // 15 context tokens, then the first choice token
  EXPECT_EQ(row.tokens[15], 40);
  EXPECT_EQ(row.targets[14], 40);
  EXPECT_EQ(row.targets[15], 41);
  EXPECT_EQ(row.targets[13], -1);
  // Ids beyond the model's vocabulary (another tokenizer): one error naming the task, and the shard.
  try {
    check_choice_ids(qs, 45, "t.jsonl");
    ADD_FAILURE() << "ids up to 49 passed a vocabulary of 45";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("t.jsonl: tokenized, it holds id 49, beyond the model's vocabulary of 45"),
              std::string::npos) << e.what();
  }
  check_choice_ids(qs, 64, "t.jsonl");
  test::Dir d;
  const std::string shard = (d.path / "big_ids.bin").string();
  write_shard(shard, std::vector<uint32_t>(40, 70), {0}, 2);
  try {
    shard_loss(m, shard, spec.seq);
    ADD_FAILURE() << "id 70 passed a vocabulary of 64";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(shard + " holds token id 70, beyond the model's vocabulary of 64"),
              std::string::npos) << e.what();
  }
  TokenizedChoice too_long{{2}, {std::vector<int64_t>(17, 5), {6}}, {17, 1}, 0, 9};
  try {
    choice_row(too_long, 0, spec.seq);
    ADD_FAILURE() << "a choice longer than the sequence was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("task line 9: choice 0 has 17 tokens"), std::string::npos) << e.what();
  }
}

TEST(ChoiceEval, TokenizerSplitsAsTheHarness) {
  test::Dir d;
  const std::string tokenizer = test::tiny_tokenizer(d, MESHTRAIN_BIN);
  const std::string task = d.write("t.jsonl", R"({"context": "In the beginning God ", "choices": ["created the heaven", "and the earth 5"], "answer": 0}
{"context": "the heaven", "choices": [" and the earth", " God"], "answer": 1}
)");
  const std::string helper = (std::filesystem::path(MESHTRAIN_BIN).parent_path() / "meshtrain-tokenize").string();
  const auto qs = tokenize_choice_task(task, tokenizer, helper);
  ASSERT_EQ(qs.size(), 2u);
  auto encode = [&](const std::string& text) {
    std::istringstream in(capture_output({helper, "encode", "--tokenizer", tokenizer, "--text", text}));
    std::vector<int64_t> ids;
    for (int64_t id; in >> id;) ids.push_back(id);
    return ids;
  };
  const std::vector<std::string> contexts{"In the beginning God", "the heaven"};
  const std::vector<std::vector<std::string>> choices{{" created the heaven", " and the earth 5"}, {" and the earth", " God"}};
  for (size_t i = 0; i < qs.size(); ++i) {
    std::vector<int64_t> context{2};  // the end-of-sequence id first (tokenize's --eos_id=2)
    const auto c = encode(contexts[i]);
    context.insert(context.end(), c.begin(), c.end());
    EXPECT_EQ(qs[i].context, context);
    for (size_t k = 0; k < 2; ++k) {
      // The context's ids and the choice's are the whole text's (trailing spaces moved to the choice).
      std::vector<int64_t> joined(context.begin() + 1, context.end());
      joined.insert(joined.end(), qs[i].choices[k].begin(), qs[i].choices[k].end());
      EXPECT_EQ(joined, encode(contexts[i] + choices[i][k]));
    }
  }
  EXPECT_EQ(qs[0].chars, (std::vector<int64_t>{18, 15}));  // the choices as written, spaces not moved
  EXPECT_EQ(qs[1].answer, 1);
  // A bad task fails before the helper runs, naming its line.
  const std::string bad = d.write("bad.jsonl", R"({"context": "a", "choices": [" b", " c"], "answer": 5})" "\n");
  try {
    tokenize_choice_task(bad, tokenizer, helper);
    ADD_FAILURE() << "answer 5 of 2 choices was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":1: answer 5 is out of range"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
