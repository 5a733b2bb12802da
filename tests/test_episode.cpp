// Agentic episodes (rl/environment.h, rl/episode.h): the calculator's
// arithmetic and replies; an episode's replies are exactly the environment's,
// masked (no loss, zero gradient) and with no log-probability; the policy's
// tokens' log-probabilities equal a full forward's (ratio 1) across turns; a
// batch of episodes equals each alone; an environment that never ends stops at
// the turn limit, marked truncated, as does one whose replies outgrow the model.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/episode.h"
#include "meshtrain/rl/grpo.h"
#include "meshtrain/rl/grpo_objective.h"
#include "tests/tiny_model.h"

namespace meshtrain {
namespace {

TEST(Environment, CalculatorArithmeticAndReplies) {
  int64_t v = 0;
  for (const auto& [e, want] : std::vector<std::pair<std::string, int64_t>>{
           {"37*58", 2146}, {"2+3*4", 14}, {"10-3-2", 5}, {"2*3*4-30", -6}, {"007", 7}}) {
    ASSERT_TRUE(calculate(e, v)) << e;
    EXPECT_EQ(v, want) << e;
  }
  for (const char* bad : {"", "3+", "+3", "3**4", "a", "1=", "99999999999*99999999999", "9223372036854775808"}) {
    EXPECT_FALSE(calculate(bad, v)) << bad;
  }
  Calculator calc;
  const TaskExample ex{"37*58=", "2146"};
  EXPECT_EQ(calc.step(ex, "37*58=", false).observation, "2146:");
  EXPECT_FALSE(calc.step(ex, "37*58=", false).done);
  EXPECT_EQ(calc.step(ex, "3+=", false).observation, "err:");
  EXPECT_TRUE(calc.step(ex, "2146\n", true).done) << "the end token ends the episode";
  const EnvReply cut = calc.step(ex, "214", false);
  EXPECT_FALSE(cut.done);
  EXPECT_EQ(cut.observation, "") << "a turn cut at max_new is neither a call nor an answer";
  EXPECT_THROW(make_environment("browser"), std::invalid_argument);
  EXPECT_EQ(make_environment(""), nullptr);
}

// Replies "7:" to every turn and never ends the episode.
class Endless : public Environment {
 public:
  std::vector<std::string> turn_stops() const override { return {"="}; }
  EnvReply step(const TaskExample&, const std::string&, bool) override { return {"7:", false}; }
};

plan::ModelSpec char_model(int64_t seq) { return test::tiny_llama(CharVocab::size(), seq); }

EpisodeOptions options(Environment* env, int64_t max_turns) {
  EpisodeOptions o;
  o.rollout.sample.max_new_tokens = 3;
  o.rollout.sample.temperature = 1.0;
  o.rollout.sample.stop_token = CharVocab::end();
  o.rollout.sample.vocab_limit = CharVocab::size();
  o.env = env;
  o.max_turns = max_turns;
  return o;
}

TEST(Episode, RepliesAreMaskedAndLogprobsMatchAFullForward) {
  Comm solo("solo", 0);
  Transformer m(char_model(64), solo, false, 7);
  Endless env;
  const std::vector<TaskExample> ex{{"12+5=", "17"}, {"3*4=", "12"}, {"99-1=", "98"}, {"12+5=", "17"}};
  std::vector<std::vector<int64_t>> prompts;
  std::vector<const TaskExample*> exs;
  for (const auto& e : ex) {
    prompts.push_back(CharVocab::encode(e.prompt));
    exs.push_back(&e);
  }
  const std::vector<uint64_t> seeds{1, 2, 3, 4};
  const auto eps = run_episodes(m, prompts, exs, seeds, options(&env, 3));
  const std::vector<int64_t> reply = CharVocab::encode("7:");
  for (size_t i = 0; i < eps.size(); ++i) {
    const Episode& e = eps[i];
    ASSERT_EQ(e.generated.size(), e.logp.size());
    ASSERT_EQ(e.generated.size(), e.policy.size());
    EXPECT_EQ(e.turns, 3) << "an endless environment runs to the turn limit";
    EXPECT_TRUE(e.truncated);
    // Structure: turn, "7:", turn, "7:", turn: each reply exactly the environment's, with no log-prob.
    size_t replies = 0;
    for (size_t t = 0; t < e.generated.size(); ++t) {
      if (e.policy[t]) continue;
      EXPECT_EQ(e.generated[t], reply[replies % 2]) << i << " " << t;
      EXPECT_EQ(e.logp[t], 0.0f);
      ++replies;
    }
    EXPECT_EQ(replies, 4u) << "two replies between three turns";
    EXPECT_EQ(e.policy.back(), 1) << "the last turn is the policy's";
    // A batch of episodes equals each alone (its own generators, turn by turn).
    const auto one = run_episodes(m, {prompts[i]}, {exs[i]}, {seeds[i]}, options(&env, 3));
    EXPECT_EQ(one[0].generated, e.generated) << i;
  }
  EXPECT_NE(eps[0].generated, eps[3].generated) << "same prompt, other seed";
  // The training step's view: ratio 1 at the policy's tokens (multi-turn, no cache vs cached
  // turns), and the replies contribute no loss and no gradient.
  RolloutBatch b = episode_batch(eps, CharVocab::end());
  const at::Tensor logp = token_logprobs(m, b.tokens, 1.0, CharVocab::size(), false).detach().requires_grad_(true);
  EXPECT_LT(((logp - b.old_logp) * b.mask).abs().max().item<double>(), 1e-5);
  const at::Tensor adv = at::tensor({1.0f, -0.5f, 2.0f, 0.25f});
  GrpoOptions o;
  const GrpoTerms t = grpo_loss(logp, b.old_logp, {}, adv, b.mask, o, b.mask.sum().item<double>());
  t.loss.backward();
  const at::Tensor replies = (b.mask == 0) & (b.tokens.narrow(1, 1, b.tokens.size(1) - 1) != CharVocab::end());
  EXPECT_GT(replies.sum().item<int64_t>(), 0);
  EXPECT_EQ(logp.grad().masked_select(replies).abs().max().item<double>(), 0) << "replies get zero gradient";
  EXPECT_GT(logp.grad().masked_select(b.mask > 0).abs().min().item<double>(), 0) << "policy tokens get gradient";
  // Changing what the model would assign to the replies changes nothing.
  const at::Tensor moved = logp.detach() + replies.to(at::kFloat) * 3.0;
  EXPECT_EQ(grpo_loss(moved, b.old_logp, {}, adv, b.mask, o, b.mask.sum().item<double>()).loss.item<double>(),
            t.loss.item<double>());
}

TEST(Episode, EndsAtTheModelsLengthAndSingleTurnIsOneCompletion) {
  Comm solo("solo", 0);
  Transformer m(char_model(16), solo, false, 9);
  Endless env;
  const TaskExample ex{"12+5=", "17"};
  // 16 positions: the prompt (5) and turns of <= 3 plus "7:" cannot reach 100 turns.
  const auto eps = run_episodes(m, {CharVocab::encode(ex.prompt)}, {&ex}, {5}, options(&env, 100));
  EXPECT_TRUE(eps[0].truncated);
  EXPECT_LE(eps[0].prompt.size() + eps[0].generated.size(), 16u);
  EXPECT_LT(eps[0].turns, 100);
  // Without an environment: one turn, every token the policy's, the answer = the completion.
  const auto single = run_episodes(m, {CharVocab::encode(ex.prompt)}, {&ex}, {5}, options(nullptr, 4));
  EXPECT_EQ(single[0].turns, 1);
  EXPECT_EQ(single[0].answer, single[0].generated);
  EXPECT_FALSE(single[0].truncated);
  EXPECT_THROW(run_episodes(m, {CharVocab::encode(ex.prompt)}, {&ex}, {5}, options(&env, 0)), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
