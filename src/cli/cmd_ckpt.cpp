// meshtrain ckpt verify DIR | ckpt export DIR --out model.safetensors [--format hf [--tokenizer M]] [--force]
//                         | ckpt import HF_DIR --out CKPT_DIR [--force]
// DIR is a step directory or a checkpoint directory (its newest step is used).
// --format hf writes a Hugging Face directory (model.safetensors, config.json, and the
// run's tokenizer when there is one: ckpt/hf_tokenizer.h);
// import turns one into a meshtrain checkpoint that [init] from loads on any mesh;
// --format peft writes a LoRA checkpoint's adapters for peft (ckpt/peft.h).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "cli/commands.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/hf.h"
#include "meshtrain/ckpt/peft.h"

namespace meshtrain::cli {

Run add_ckpt(CLI::App& app) {
  struct Opts {
    std::string dir, out, format = "meshtrain", tokenizer;
    bool force = false, adapters_only = false;
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
  exp->add_flag("--adapters-only", o->adapters_only,
                "LoRA: write the adapters alone (default: merged into the base weights)");
  exp->add_option("--format", o->format,
                  "meshtrain (one safetensors file) | hf (a Hugging Face directory) | peft (LoRA adapters for peft)")
      ->capture_default_str();
  exp->add_option("--tokenizer", o->tokenizer,
                  "--format hf: the SentencePiece model to ship (default: tokenizer.model beside the run's data)");
  auto imp = cmd->add_subcommand("import", "a Hugging Face GPT-2 or Llama directory as a meshtrain checkpoint");
  imp->add_option("dir", o->dir, "directory with config.json and model.safetensors")->required();
  imp->add_option("--out", o->out, "checkpoint directory to write")->required();
  imp->add_flag("--force", o->force, "replace an existing checkpoint directory");
  return [o, verify, exp, imp]() -> int {
    if (imp->parsed()) {
      ckpt::import_hf(o->dir, o->out, o->force);
      fmt::print("wrote {} (step 0, from {})\n", o->out, o->dir);
      return 0;
    }
    const std::string dir = ckpt::resolve(o->dir);
    if (verify->parsed()) {
      const ckpt::VerifyReport r = ckpt::verify(dir);
      for (const auto& p : r.problems) fmt::print("BAD  {}\n", p);
      fmt::print("{}: {} tensors, {} shards, {:.1f} MiB checked: {}\n", dir, r.tensors, r.shards,
                 static_cast<double>(r.bytes) / (1 << 20),
                 r.problems.empty() ? "all checksums match" : fmt::format("{} problems", r.problems.size()));
      return r.problems.empty() ? 0 : 1;
    }
    if (o->format == "hf") {
      const std::string model =
          o->tokenizer.empty() ? ckpt::tokenizer_beside_data(ckpt::Reader(dir).manifest()) : o->tokenizer;
      std::optional<ckpt::HfTokenizer> tok;
      if (!model.empty()) tok = ckpt::describe_tokenizer(model);
      ckpt::export_hf(dir, o->out, o->force, tok ? &*tok : nullptr);
      fmt::print("wrote {} (Hugging Face model.safetensors and config.json of {}{})\n", o->out, dir,
                 tok ? ", and tokenizer " + tok->model : "; no tokenizer beside the run's data: pass --tokenizer MODEL");
      return 0;
    }
    if (!o->tokenizer.empty()) throw std::invalid_argument("--tokenizer goes with --format hf");
    if (o->format == "peft") {
      ckpt::export_peft(dir, o->out, o->force);
      fmt::print("wrote {} (peft adapter_model.safetensors and adapter_config.json of {}; load them on the base's "
                 "--format hf export)\n",
                 o->out, dir);
      return 0;
    }
    if (o->format != "meshtrain") {
      throw std::invalid_argument(fmt::format("--format {}: use meshtrain, hf or peft", o->format));
    }
    ckpt::export_model(dir, o->out, o->force, o->adapters_only);
    fmt::print("wrote {} (full weights of {})\n", o->out, dir);
    return 0;
  };
}

}  // namespace meshtrain::cli
