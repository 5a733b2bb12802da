// Environments for agentic, multi-turn episodes (rl/episode.h): the
// policy's output can call a tool, and the environment's reply is appended to
// the episode as tokens that the policy did not generate, so they are masked
// out of the loss (the agentic POMDP of arXiv 2509.02547: an episode is
// x, a_1, o_1, a_2, o_2, ..., only the a_k trained; shared/reference/methods.md §1.3).
//
// A policy turn ends at the end token, at one of the environment's turn_stops,
// or at rl.max_new tokens; the environment then answers with an observation
// (text of the task's character vocabulary, data/tasks.h) and whether the
// episode is over.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/tasks.h"

namespace meshtrain {

struct EnvReply {
  std::string observation;  // appended after the turn (never trained); may be empty
  bool done = false;        // the episode ends: the turn was the answer
};

class Environment {
 public:
  virtual ~Environment() = default;
  // Text that ends a policy turn besides the end token (a tool call's end).
  virtual std::vector<std::string> turn_stops() const = 0;
  // The reply to the policy's turn `turn` (its text, the stop included) in
  // the episode of `example`; `ended`: the turn ended with the end token.
  virtual EnvReply step(const TaskExample& example, const std::string& turn, bool ended) = 0;
};

// The shipped calculator: a turn ending with "=" is a call, its text before
// "=" an integer expression of + - * (usual precedence, e.g. "37*58"); the
// reply is its value then ":" ("2146:"), or "err:" for a malformed or
// overflowing one. A turn ending with the end token is the answer (the
// episode ends); a turn cut at max_new is neither and the episode goes on.
// The answer is scored by the task's reward (data/tasks.h) on that last turn.
//   "37*58=" -> policy "37*58=" -> env "2146:" -> policy "2146\n"
class Calculator : public Environment {
 public:
  std::vector<std::string> turn_stops() const override { return {"="}; }
  EnvReply step(const TaskExample& example, const std::string& turn, bool ended) override;
};

// The value of an expression of non-negative integers with + - * (no
// parentheses), or false when it is malformed or leaves int64.
bool calculate(const std::string& expression, int64_t& value);

// "calculator" (or "" : none, single-turn). Throws std::invalid_argument naming the value.
std::unique_ptr<Environment> make_environment(const std::string& name);

}  // namespace meshtrain
