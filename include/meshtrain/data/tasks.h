// Verifiable tasks shipped for reinforcement learning (rl/), with their own
// character vocabulary so that prompts, answers and rewards need no tokenizer
// process: the reward of a completion is computed from its ids in the
// training process.
//
//   arithmetic  "37+58=" -> "95", "81-26=" -> "55", "12*7=" -> "84"
//               (operands uniform below 10^digits; subtraction never negative)
//   reverse     "rev:abcd=" -> "dcba" (1..digits lowercase letters)
//
// A completion ends with the end token ("\n", id 0). Its reward is 1 when its
// text before the end is the answer, plus a format reward (0.1) when it ended
// and holds only the answer's kind of characters (digits, or letters).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

class CharVocab {
 public:
  // id i is kChars[i]; id 0 ("\n") ends a completion.
  static constexpr const char* kChars = "\n0123456789+-*=:abcdefghijklmnopqrstuvwxyz";
  static int64_t size();
  static constexpr int64_t end() { return 0; }
  // Throws std::invalid_argument naming a character outside the vocabulary.
  static std::vector<int64_t> encode(const std::string& text);
  // Ids outside the vocabulary decode as '?'.
  static std::string decode(const std::vector<int64_t>& ids);
};

struct TaskExample {
  std::string prompt, answer;
};

// `count` examples of task `name` ("arithmetic" | "reverse") from `seed`.
// Throws std::invalid_argument for an unknown task or digits outside 1..9.
std::vector<TaskExample> task_examples(const std::string& name, uint64_t seed, int64_t count, int digits);

// What `meshtrain tokenize task` writes: SFT examples (`count`), RL prompts
// and held-out evaluation examples (count / 4 + 1 each, from other seeds). The
// evaluation prompts are distinct and appear in neither of the others, so
// held-out accuracy measures what was not trained on (a small problem space,
// e.g. one digit, can leave fewer examples than asked).
struct TaskSplit {
  std::vector<TaskExample> train, prompts, eval;
};
TaskSplit task_split(const std::string& name, uint64_t seed, int64_t count, int digits);

// A wrong answer close to the right one (a preference pair's rejected side):
// arithmetic changes one digit (never leading a multi-digit number with 0),
// reverse swaps two letters or changes one. A function of `seed`.
std::string near_miss(const TaskExample& e, uint64_t seed);

// The {"prompt", "answer"} lines of a JSONL file (prompts.jsonl, eval.jsonl);
// throws std::invalid_argument naming the file and line of a bad one.
std::vector<TaskExample> read_task_examples(const std::string& path);

struct TaskReward {
  double exact = 0, format = 0;
  double total() const { return exact + format; }
};
// `completion`: the generated ids (the end token, when generated, included).
TaskReward task_reward(const std::vector<int64_t>& completion, const TaskExample& e);

}  // namespace meshtrain
