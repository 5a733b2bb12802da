#include "meshtrain/rl/reward.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "meshtrain/platform/subprocess.h"

namespace meshtrain {

RewardFn task_reward_fn() {
  return [](const TaskExample& e, const std::vector<int64_t>& completion) { return task_reward(completion, e).total(); };
}

namespace {

// A private scratch directory, removed with everything in it when it goes out of scope.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "meshtrain_reward_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      throw std::runtime_error(fmt::format("cannot make a scratch directory {}: {}", tmpl, std::strerror(errno)));
    }
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Runs `argv` with stdin from `in` and stdout to `out` (created, 0600), in its own process group;
// returns its wait status, or kills the group and throws after `timeout_s`.
int run_with_files(const std::vector<std::string>& argv, const std::string& in, const std::string& out,
                   const RewardCommand& c) {
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, in.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &files, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    throw std::runtime_error(fmt::format("reward command `{}`: cannot start '{}': {}", c.command, argv[0], std::strerror(rc)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.timeout_s);
  int status = 0;
  while (true) {
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) throw std::runtime_error(fmt::format("reward command `{}`: waitpid failed", c.command));
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      throw std::runtime_error(fmt::format("reward command `{}` did not finish within {:g} s (rl.reward_timeout); killed",
                                           c.command, c.timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

}  // namespace

std::vector<double> command_rewards(const RewardCommand& c, const std::vector<TaskExample>& examples,
                                    const std::vector<std::vector<int64_t>>& completions) {
  namespace fs = std::filesystem;
  if (examples.size() != completions.size()) throw std::invalid_argument("command_rewards: one completion per example");
  const std::vector<std::string> argv =
      c.shell ? std::vector<std::string>{"/bin/sh", "-c", c.command} : command_words(c.command, "rl.reward_command");
  const ScratchDir scratch;
  const fs::path in = scratch.path / "completions.jsonl", out = scratch.path / "scores.txt";
  {
    std::ofstream f(in);
    for (size_t i = 0; i < examples.size(); ++i) {
      const auto& comp = completions[i];
      const auto end = std::find(comp.begin(), comp.end(), CharVocab::end());
      f << nlohmann::json{{"prompt", examples[i].prompt}, {"answer", examples[i].answer},
                          {"completion", CharVocab::decode({comp.begin(), end})}}
               .dump()
        << "\n";
    }
  }
  const int status = run_with_files(argv, in.string(), out.string(), c);
  const std::string& command = c.command;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(fmt::format("reward command `{}` failed (exit status {}) on {} completions", command,
                                         WIFEXITED(status) ? WEXITSTATUS(status) : -1, examples.size()));
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
