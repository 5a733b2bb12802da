#include "meshtrain/rl/episode.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "meshtrain/model/transformer.h"

namespace meshtrain {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::vector<Episode> run_episodes(Transformer& m, const std::vector<std::vector<int64_t>>& prompts,
                                  const std::vector<const TaskExample*>& examples, const std::vector<uint64_t>& seeds,
                                  const EpisodeOptions& o) {
  if (prompts.size() != examples.size() || prompts.size() != seeds.size()) {
    throw std::invalid_argument(fmt::format("run_episodes: {} prompts, {} examples and {} seeds must match",
                                            prompts.size(), examples.size(), seeds.size()));
  }
  if (o.max_turns < 1) throw std::invalid_argument(fmt::format("max_turns = {} must be >= 1", o.max_turns));
  const size_t n = prompts.size();
  std::vector<Episode> eps(n);
  std::vector<bool> live(n, true);
  for (size_t i = 0; i < n; ++i) eps[i].prompt = prompts[i];
  RolloutOptions ro = o.rollout;
  if (o.env) {
    for (const auto& s : o.env->turn_stops()) ro.stop_sequences.push_back(CharVocab::encode(s));
  }
  const int64_t seq = m.spec().seq;
  for (int64_t turn = 0; turn < o.max_turns; ++turn) {
    // Live episodes by current length, each group one batch.
    std::map<int64_t, std::vector<size_t>> by_length;
    for (size_t i = 0; i < n; ++i) {
      if (!live[i]) continue;
      const int64_t len = static_cast<int64_t>(eps[i].prompt.size() + eps[i].generated.size());
      if (len >= seq) {
        eps[i].truncated = true;  // no room for another token
        live[i] = false;
        continue;
      }
      by_length[len].push_back(i);
    }
    if (by_length.empty()) break;
    for (const auto& [len, ids] : by_length) {
      std::vector<int64_t> flat;
      std::vector<uint64_t> turn_seeds;
      for (size_t i : ids) {
        flat.insert(flat.end(), eps[i].prompt.begin(), eps[i].prompt.end());
        flat.insert(flat.end(), eps[i].generated.begin(), eps[i].generated.end());
        turn_seeds.push_back(turn == 0 ? seeds[i] : splitmix64(seeds[i] + static_cast<uint64_t>(turn)));
      }
      RolloutOptions t = ro;
      t.sample.max_new_tokens = std::min(ro.sample.max_new_tokens, seq - len);
      const int64_t rows = static_cast<int64_t>(ids.size());
      const Rollout r = rollout(m, at::tensor(flat, at::kLong).view({rows, len}), t, turn_seeds);
      for (int64_t k = 0; k < rows; ++k) {
        Episode& e = eps[ids[k]];
        const int64_t got = r.lengths[k].item<int64_t>();
        const at::Tensor gen = r.tokens[k].narrow(0, len, got).contiguous();
        const at::Tensor lp = r.logprobs[k].narrow(0, 0, got).contiguous();
        std::vector<int64_t> turn_ids(gen.data_ptr<int64_t>(), gen.data_ptr<int64_t>() + got);
        e.generated.insert(e.generated.end(), turn_ids.begin(), turn_ids.end());
        e.logp.insert(e.logp.end(), lp.data_ptr<float>(), lp.data_ptr<float>() + got);
        e.policy.insert(e.policy.end(), static_cast<size_t>(got), 1);
        e.answer = turn_ids;
        e.turns = turn + 1;
        const bool ended = got > 0 && turn_ids.back() == ro.sample.stop_token;
        if (!o.env) {
          live[ids[k]] = false;  // single-turn: the completion is the episode
          continue;
        }
        const EnvReply reply = o.env->step(*examples[ids[k]], CharVocab::decode(turn_ids), ended);
        if (reply.done) {
          live[ids[k]] = false;
          continue;
        }
        if (turn + 1 == o.max_turns) {
          e.truncated = true;  // the turn limit: no reply after the last turn
          live[ids[k]] = false;
          continue;
        }
        const std::vector<int64_t> obs = CharVocab::encode(reply.observation);
        const int64_t room = seq - static_cast<int64_t>(e.prompt.size() + e.generated.size());
        if (static_cast<int64_t>(obs.size()) >= room) {
          e.truncated = true;  // the reply (and a token after it) does not fit
          live[ids[k]] = false;
          continue;
        }
        e.generated.insert(e.generated.end(), obs.begin(), obs.end());
        e.logp.insert(e.logp.end(), obs.size(), 0.0f);
        e.policy.insert(e.policy.end(), obs.size(), 0);
      }
    }
  }
  return eps;
}

RolloutBatch episode_batch(const std::vector<Episode>& eps, int64_t pad) {
  size_t S = 0;
  for (const auto& e : eps) S = std::max(S, e.prompt.size() + e.generated.size());
  const int64_t R = static_cast<int64_t>(eps.size());
  RolloutBatch b;
  b.tokens = at::full({R, static_cast<int64_t>(S)}, pad, at::kLong);
  b.old_logp = at::zeros({R, static_cast<int64_t>(S) - 1}, at::kFloat);
  b.mask = at::zeros({R, static_cast<int64_t>(S) - 1}, at::kFloat);
  for (int64_t i = 0; i < R; ++i) {
    const Episode& e = eps[i];
    const int64_t p = static_cast<int64_t>(e.prompt.size()), n = static_cast<int64_t>(e.generated.size());
    std::vector<int64_t> row = e.prompt;
    row.insert(row.end(), e.generated.begin(), e.generated.end());
    b.tokens[i].narrow(0, 0, p + n).copy_(at::tensor(row, at::kLong));
    if (n > 0) {
      // Token p + t is predicted at position p + t - 1.
      b.old_logp[i].narrow(0, p - 1, n).copy_(at::tensor(e.logp, at::kFloat));
      b.mask[i].narrow(0, p - 1, n).copy_(at::tensor(std::vector<float>(e.policy.begin(), e.policy.end()), at::kFloat));
    }
  }
  return b;
}

}  // namespace meshtrain
