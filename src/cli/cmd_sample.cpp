// meshtrain sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T]
//   [--top-k K] [--top-p P] [--seed S] [--samples N] [--tokenizer MODEL]
// Loads a checkpoint saved on any mesh into one process (tp = 1) and
// continues the prompt. Text goes through meshtrain-tokenize (SentencePiece
// cannot share this process with libtorch).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/model/sampler.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/train/exact_match.h"
#include "meshtrain/train/state.h"

namespace fs = std::filesystem;

namespace meshtrain::cli {

Run add_sample(CLI::App& app) {
  struct Opts {
    std::string ckpt, prompt = "In the beginning", tokenizer;
    SampleOptions s;
    int samples = 1;
  };
  auto o = std::make_shared<Opts>();
  o->s.seed = 1;
  auto cmd = app.add_subcommand("sample", "generate text from a checkpoint (KV cache; temperature, top-k, top-p)");
  cmd->add_option("checkpoint", o->ckpt, "checkpoint (step directory or its parent)")->required();
  cmd->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  cmd->add_option("--tokens", o->s.max_new_tokens, "new tokens per sample")->capture_default_str();
  cmd->add_option("--temperature", o->s.temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->s.top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->s.top_p, "nucleus: smallest set with this much probability")->capture_default_str();
  cmd->add_option("--seed", o->s.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--samples", o->samples, "how many continuations")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "SentencePiece model (default: tokenizer.model beside the training data)");
  return [o]() -> int {
    validate(o->s);
    const std::string dir = ckpt::resolve(o->ckpt);
    ckpt::Reader reader(dir);
    const auto& m = reader.manifest();
    if (!m.contains("config")) throw std::runtime_error(fmt::format("{} has no model description", dir));
    plan::ModelSpec spec = spec_from_json(m["config"]["model"]);
    std::string tokenizer = o->tokenizer;
    if (tokenizer.empty()) {
      const auto data = m["config"]["train"].value("data", std::vector<std::string>{});
      if (!data.empty()) tokenizer = (fs::path(data[0]).parent_path() / "tokenizer.model").string();
      if (tokenizer.empty() || !fs::exists(tokenizer)) {
        throw std::runtime_error(fmt::format("no tokenizer found ({}); pass --tokenizer MODEL",
                                             tokenizer.empty() ? "the checkpoint names no data" : tokenizer));
      }
    }
    const std::string helper = (fs::path(self_exe()).parent_path() / "meshtrain-tokenize").string();
    std::vector<int64_t> prompt;
    {
      std::istringstream ids(capture_output({helper, "encode", "--tokenizer", tokenizer, "--text", o->prompt}));
      for (int64_t id; ids >> id;) prompt.push_back(id);
    }
    o->s.vocab_limit = std::stoll(capture_output({helper, "vocab", "--tokenizer", tokenizer}));
    Comm solo("tp", 0);
    // LoRA merged, a QLoRA run's base found again (train/exact_match.h).
    auto loaded = load_for_inference(dir, solo);
    Transformer& model = *loaded;
    fmt::print("{}: {} at step {}, {} prompt tokens\n", dir, spec.name, m.value("step", int64_t{0}), prompt.size());
    for (int i = 0; i < o->samples; ++i) {
      SampleOptions s = o->s;
      s.seed += static_cast<uint64_t>(i);
      const auto out = generate(model, prompt, s);
      std::string ids;
      for (int64_t t : prompt) ids += fmt::format("{} ", t);
      for (int64_t t : out) ids += fmt::format("{} ", t);
      fmt::print("--- sample {} (temperature {}, top-k {}, top-p {}, seed {})\n{}\n", i + 1, s.temperature, s.top_k,
                 s.top_p, s.seed, capture_output({helper, "decode", "--tokenizer", tokenizer, "--ids", ids}));
    }
    return 0;
  };
}

}  // namespace meshtrain::cli
