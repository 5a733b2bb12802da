// Episodes: a prompt, then the policy's turns and (with an environment,
// rl/environment.h) the environment's replies, until the environment says the
// episode is over, rl.max_turns policy turns, or the model's sequence length.
// Without an environment an episode is one turn: a completion (rl/rollout.h).
//
// Each turn generates for every live episode at once, grouped by current
// length (a rollout batch has one prompt length: no padding in the KV cache);
// an episode's turn k samples from its own generator seeded from (seed, k), so
// an episode does not depend on its batch or on the number of ranks. The
// trainer keeps the exact token ids generated and replied ("token in, token
// out": nothing is re-tokenised), each generated token's log-probability, and
// which tokens the policy produced: only those are trained.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/tasks.h"
#include "meshtrain/rl/environment.h"
#include "meshtrain/rl/grpo_objective.h"
#include "meshtrain/rl/rollout.h"

namespace meshtrain {

class Transformer;

struct Episode {
  std::vector<int64_t> prompt;
  std::vector<int64_t> generated;  // every token after the prompt: the policy's turns and the replies
  std::vector<float> logp;         // per generated token: its sampling log-probability (0 for a reply's)
  std::vector<uint8_t> policy;     // per generated token: 1 the policy's (trained), 0 the environment's
  std::vector<int64_t> answer;     // the last policy turn's tokens: what the reward scores
  int64_t turns = 0;               // policy turns
  bool truncated = false;          // ended by max_turns or the model's length, not by the environment
};

struct EpisodeOptions {
  RolloutOptions rollout;        // per turn (sample.max_new_tokens: the turn's limit); stop sequences are the env's
  Environment* env = nullptr;    // null: single-turn
  int64_t max_turns = 1;
};

// Episodes of `examples` (encoded prompts `prompts`, one seed each).
std::vector<Episode> run_episodes(Transformer& m, const std::vector<std::vector<int64_t>>& prompts,
                                  const std::vector<const TaskExample*>& examples, const std::vector<uint64_t>& seeds,
                                  const EpisodeOptions& o);

// The rollout batch of `eps` (rl/grpo_objective.h): rows prompt + episode,
// right-padded with `pad` to a common length, masked to the policy's tokens;
// the advantages are the caller's.
RolloutBatch episode_batch(const std::vector<Episode>& eps, int64_t pad);

// SplitMix64 (Steele et al. 2014): derived seeds (a turn's, a completion's).
uint64_t splitmix64(uint64_t x);

}  // namespace meshtrain
