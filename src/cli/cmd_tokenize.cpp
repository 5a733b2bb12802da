// meshtrain tokenize ...: runs meshtrain-tokenize (beside this binary) with the
// same arguments. The tokenizer cannot live in this process: SentencePiece and
// libtorch register the same protobuf descriptors and crash together.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/commands.h"

namespace meshtrain::cli {

Run add_tokenize(CLI::App& app) {
  auto cmd = app.add_subcommand(
      "tokenize", "train a BPE tokenizer (SentencePiece) and write token shards; see meshtrain-tokenize");
  cmd->allow_extras();
  cmd->prefix_command();
  return [cmd]() -> int {
    const std::string helper = (std::filesystem::path(self_exe()).parent_path() / "meshtrain-tokenize").string();
    std::vector<std::string> args{helper};
    for (const auto& a : cmd->remaining()) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(helper.c_str(), argv.data());
    throw std::runtime_error(fmt::format("cannot run {}: build it with the meshtrain target", helper));
  };
}

}  // namespace meshtrain::cli
