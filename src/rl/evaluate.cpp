#include "meshtrain/rl/evaluate.h"

#include <ATen/Functions.h>

#include <fmt/format.h>

#include <map>
#include <stdexcept>

#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/rollout.h"

namespace meshtrain {

TaskScore evaluate_task(Transformer& m, const std::vector<TaskExample>& examples, int64_t max_new_tokens,
                        int64_t batch, double temperature, uint64_t seed) {
  if (m.spec().vocab < CharVocab::size()) {
    throw std::invalid_argument(fmt::format("the model's vocabulary {} is smaller than the task vocabulary ({} "
                                            "characters): not a model trained on a shipped task",
                                            m.spec().vocab, CharVocab::size()));
  }
  std::map<size_t, std::vector<size_t>> by_length;  // prompt length -> examples
  std::vector<std::vector<int64_t>> prompts;
  for (size_t i = 0; i < examples.size(); ++i) {
    prompts.push_back(CharVocab::encode(examples[i].prompt));
    by_length[prompts.back().size()].push_back(i);
  }
  RolloutOptions o;
  o.sample.temperature = temperature;
  o.sample.max_new_tokens = max_new_tokens;
  o.sample.stop_token = CharVocab::end();
  o.sample.vocab_limit = CharVocab::size();
  TaskScore s;
  for (const auto& [length, ids] : by_length) {
    for (size_t first = 0; first < ids.size(); first += static_cast<size_t>(batch)) {
      const size_t n = std::min(ids.size() - first, static_cast<size_t>(batch));
      std::vector<int64_t> flat;
      for (size_t k = 0; k < n; ++k) flat.insert(flat.end(), prompts[ids[first + k]].begin(), prompts[ids[first + k]].end());
      std::vector<uint64_t> seeds;
      for (size_t k = 0; k < n; ++k) seeds.push_back(seed * 1000003 + ids[first + k]);
      const Rollout r = rollout(m, at::tensor(flat, at::kLong).view({static_cast<int64_t>(n), static_cast<int64_t>(length)}),
                                o, seeds);
      for (size_t k = 0; k < n; ++k) {
        const int64_t len = r.lengths[static_cast<int64_t>(k)].item<int64_t>();
        const at::Tensor gen = r.tokens[static_cast<int64_t>(k)].narrow(0, r.prompt, len).contiguous();
        const std::vector<int64_t> ids_k(gen.data_ptr<int64_t>(), gen.data_ptr<int64_t>() + len);
        const TaskReward rw = task_reward(ids_k, examples[ids[first + k]]);
        s.examples += 1;
        s.exact += rw.exact > 0;
        s.reward += rw.total();
      }
    }
  }
  if (s.examples) s.reward /= static_cast<double>(s.examples);
  return s;
}

}  // namespace meshtrain
