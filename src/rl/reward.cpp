#include "meshtrain/rl/reward.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace meshtrain {

RewardFn task_reward_fn() {
  return [](const TaskExample& e, const std::vector<int64_t>& completion) { return task_reward(completion, e).total(); };
}

std::vector<double> command_rewards(const std::string& command, const std::vector<TaskExample>& examples,
                                    const std::vector<std::vector<int64_t>>& completions, const std::string& scratch_dir) {
  namespace fs = std::filesystem;
  if (examples.size() != completions.size()) throw std::invalid_argument("command_rewards: one completion per example");
  fs::create_directories(scratch_dir);
  const fs::path in = fs::path(scratch_dir) / "completions.jsonl", out = fs::path(scratch_dir) / "scores.txt";
  {
    std::ofstream f(in);
    for (size_t i = 0; i < examples.size(); ++i) {
      const auto& c = completions[i];
      const auto end = std::find(c.begin(), c.end(), CharVocab::end());
      f << nlohmann::json{{"prompt", examples[i].prompt}, {"answer", examples[i].answer},
                          {"completion", CharVocab::decode({c.begin(), end})}}
               .dump()
        << "\n";
    }
  }
  const std::string line = fmt::format("{} < '{}' > '{}'", command, in.string(), out.string());
  const int status = std::system(line.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(fmt::format("reward command `{}` failed (exit status {}) on {} completions in {}", command,
                                         WIFEXITED(status) ? WEXITSTATUS(status) : -1, examples.size(), in.string()));
  }
  std::ifstream f(out);
  std::vector<double> scores;
  int64_t n = 0;
  for (std::string s; std::getline(f, s);) {
    ++n;
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
    }
    if (used == 0 || s.find_first_not_of(" \t\r", used) != std::string::npos || !std::isfinite(v)) {
      throw std::runtime_error(fmt::format("reward command `{}`: output line {} is '{}', not a number", command, n, s));
    }
    scores.push_back(v);
  }
  if (scores.size() != examples.size()) {
    throw std::runtime_error(fmt::format("reward command `{}` printed {} scores for {} completions (one per line)",
                                         command, scores.size(), examples.size()));
  }
  return scores;
}

}  // namespace meshtrain
