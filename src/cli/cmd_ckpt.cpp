// meshtrain ckpt verify DIR | ckpt export DIR --out model.safetensors [--force]
// DIR is a step directory or a checkpoint directory (its newest step is used).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "meshtrain/ckpt/checkpoint.h"

namespace meshtrain::cli {

Run add_ckpt(CLI::App& app) {
  struct Opts {
    std::string dir, out;
    bool force = false;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("ckpt", "inspect sharded checkpoints");
  cmd->require_subcommand(1);
  auto verify = cmd->add_subcommand("verify", "check every shard of every tensor against its checksum");
  verify->add_option("dir", o->dir, "checkpoint (step directory or its parent)")->required();
  auto exp = cmd->add_subcommand("export", "write the full, unsharded model weights as one safetensors file");
  exp->add_option("dir", o->dir, "checkpoint (step directory or its parent)")->required();
  exp->add_option("--out", o->out, "output .safetensors file")->required();
  exp->add_flag("--force", o->force, "replace an existing output file");
  return [o, verify, exp]() -> int {
    const std::string dir = ckpt::resolve(o->dir);
    if (verify->parsed()) {
      const ckpt::VerifyReport r = ckpt::verify(dir);
      for (const auto& p : r.problems) fmt::print("BAD  {}\n", p);
      fmt::print("{}: {} tensors, {} shards, {:.1f} MiB checked: {}\n", dir, r.tensors, r.shards,
                 static_cast<double>(r.bytes) / (1 << 20),
                 r.problems.empty() ? "all checksums match" : fmt::format("{} problems", r.problems.size()));
      return r.problems.empty() ? 0 : 1;
    }
    ckpt::export_model(dir, o->out, o->force);
    fmt::print("wrote {} (full weights of {})\n", o->out, dir);
    return 0;
  };
}

}  // namespace meshtrain::cli
