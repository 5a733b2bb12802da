#include "meshtrain/platform/subprocess.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain {

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::string helper_path(const std::string& name) {
  return (std::filesystem::path(self_exe()).parent_path() / name).string();
}

std::string capture_output(const std::vector<std::string>& args) {
  // Standard error goes to an unlinked temporary file: read after the child ends, it cannot fill a
  // pipe that nobody drains while standard output is read.
  char err_path[] = "/tmp/meshtrain-stderr-XXXXXX";
  const int err_fd = ::mkstemp(err_path);
  if (err_fd < 0) throw std::runtime_error("cannot create a temporary file for a child's errors");
  ::unlink(err_path);
  int fds[2];
  if (::pipe(fds) != 0) {
    ::close(err_fd);
    throw std::runtime_error("pipe failed");
  }
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(err_fd, 2);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s (build the meshtrain target)\n", argv[0]);
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string err;
  ::lseek(err_fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(err_fd, buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  ::close(err_fd);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    throw std::runtime_error(fmt::format("{} failed (exit status {}){}{}", args[0], WEXITSTATUS(status),
                                         err.empty() ? "" : ": ", err));
  }
  return out;
}

std::vector<std::string> command_words(const std::string& command, const std::string& what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < command.size(); ++i) {
    const char ch = command[i];
    if (ch == ' ' || ch == '\t' || ch == '\n') {
      if (in_word) words.push_back(word), word.clear(), in_word = false;
      continue;
    }
    in_word = true;
    if (ch == '\'' || ch == '"') {
      size_t j = i + 1;
      for (; j < command.size() && command[j] != ch; ++j) {
        if (ch == '"' && command[j] == '\\' && j + 1 < command.size()) ++j;  // \" and \\ inside double quotes
        word += command[j];
      }
      if (j == command.size()) {
        throw std::invalid_argument(fmt::format("{} `{}`: the {} quote at character {} is never closed",
                                                what, command, ch == '"' ? "double" : "single", i + 1));
      }
      i = j;
    } else if (ch == '\\') {
      if (i + 1 == command.size()) {
        throw std::invalid_argument(fmt::format("{} `{}` ends with a backslash", what, command));
      }
      word += command[++i];
    } else {
      word += ch;
    }
  }
  if (in_word) words.push_back(word);
  if (words.empty()) throw std::invalid_argument(what + " is empty");
  return words;
}

}  // namespace meshtrain
