#include "meshtrain/rl/evaluate.h"

#include <ATen/Functions.h>

#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/episode.h"

namespace meshtrain {

TaskScore evaluate_task(Transformer& m, const std::vector<TaskExample>& examples, int64_t max_new_tokens,
                        int64_t batch, double temperature, uint64_t seed, Environment* env, int64_t max_turns) {
  if (m.spec().vocab < CharVocab::size()) {
    throw std::invalid_argument(fmt::format("the model's vocabulary {} is smaller than the task vocabulary ({} "
                                            "characters): not a model trained on a shipped task",
                                            m.spec().vocab, CharVocab::size()));
  }
  EpisodeOptions o;
  o.rollout.sample.temperature = temperature;
  o.rollout.sample.max_new_tokens = max_new_tokens;
  o.rollout.sample.stop_token = CharVocab::end();
  o.rollout.sample.vocab_limit = CharVocab::size();
  o.env = env;
  o.max_turns = env ? max_turns : 1;
  TaskScore s;
  for (size_t first = 0; first < examples.size(); first += static_cast<size_t>(batch)) {
    const size_t n = std::min(examples.size() - first, static_cast<size_t>(batch));
    std::vector<std::vector<int64_t>> prompts;
    std::vector<const TaskExample*> exs;
    std::vector<uint64_t> seeds;
    for (size_t i = first; i < first + n; ++i) {
      prompts.push_back(CharVocab::encode(examples[i].prompt));
      exs.push_back(&examples[i]);
      seeds.push_back(seed * 1000003 + i);
    }
    const std::vector<Episode> eps = run_episodes(m, prompts, exs, seeds, o);
    for (size_t k = 0; k < n; ++k) {
      const TaskReward rw = task_reward(eps[k].answer, *exs[k]);
      s.examples += 1;
      s.exact += rw.exact > 0;
      s.reward += rw.total();
    }
  }
  if (s.examples) s.reward /= static_cast<double>(s.examples);
  return s;
}

}  // namespace meshtrain
