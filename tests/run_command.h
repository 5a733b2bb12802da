// Runs a shell command line for tests that drive the real `meshtrain` binary.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace meshtrain::test {

struct CommandResult {
  int code = -1;       // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace meshtrain::test
