// meshtrain eval CKPT --task TASK.jsonl... [--tokenizer MODEL]: multiple-choice
// accuracy and length-normalised accuracy by log-likelihood (train/choice_eval.h);
// meshtrain eval exact-match CKPT --data DIR/train.bin [--document-mask]: the
// SFT exact-match rate of a checkpoint on `meshtrain tokenize chat` data
// (train/exact_match.h); meshtrain eval task CKPT --data eval.jsonl: accuracy
// on a shipped task (rl/evaluate.h). One process.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/rl/environment.h"
#include "meshtrain/rl/evaluate.h"
#include "meshtrain/train/choice_eval.h"
#include "meshtrain/train/exact_match.h"

namespace meshtrain::cli {

Run add_eval(CLI::App& app) {
  auto cmd = app.add_subcommand("eval", "evaluate a checkpoint: multiple-choice tasks (--task), or a subcommand");
  cmd->require_subcommand(0, 1);
  struct ChoiceOpts {
    std::string ckpt, tokenizer, samples;
    std::vector<std::string> tasks, data;
  };
  auto co = std::make_shared<ChoiceOpts>();
  cmd->add_option("ckpt", co->ckpt, "checkpoint (step directory or its parent)");
  cmd->add_option("--task", co->tasks,
                  "multiple-choice task: JSON lines {\"context\", \"choices\", \"answer\"} (repeatable; meshtrain data "
                  "choices makes one from a corpus)");
  cmd->add_option("--data", co->data, "token shards: the loss and perplexity on each (repeatable; a mixture's sources)");
  cmd->add_option("--tokenizer", co->tokenizer, "SentencePiece model (default: tokenizer.model beside the run's data)");
  cmd->add_option("--log-samples", co->samples,
                  "write every question's per-choice log-likelihoods and verdicts here (JSON lines; a new file)");
  auto em = cmd->add_subcommand("exact-match", "SFT answers reproduced exactly by greedy decoding (teacher-forced)");
  struct Opts {
    std::string ckpt, data;
    bool document_mask = false;
  };
  auto o = std::make_shared<Opts>();
  em->add_option("ckpt", o->ckpt, "checkpoint (step directory or its parent)")->required();
  em->add_option("--data", o->data, "a shard from meshtrain tokenize chat (sft.json beside it)")->required();
  em->add_flag("--document-mask", o->document_mask, "keep packed conversations apart (as train.document_mask)");
  struct TaskOpts {
    std::string ckpt, data, environment;
    int64_t max_new = 16, max_turns = 4;
  };
  auto to = std::make_shared<TaskOpts>();
  auto task = cmd->add_subcommand("task", "accuracy on a shipped task's prompts (greedy; data/tasks.h)");
  task->add_option("ckpt", to->ckpt, "checkpoint (step directory or its parent)")->required();
  task->add_option("--data", to->data, "eval.jsonl or prompts.jsonl from meshtrain tokenize task")->required();
  task->add_option("--max-new", to->max_new, "generated tokens at most (per turn)")->capture_default_str();
  task->add_option("--environment", to->environment, "multi-turn episodes with an environment: calculator");
  task->add_option("--max-turns", to->max_turns, "policy turns at most (with --environment)")->capture_default_str();
  return [o, to, task, em, co]() -> int {
    if (!task->parsed() && !em->parsed()) {
      if (co->ckpt.empty() || (co->tasks.empty() && co->data.empty())) {
        throw std::invalid_argument(
            "meshtrain eval: give CKPT --task TASK.jsonl and/or --data SHARD.bin (or a subcommand: exact-match, task)");
      }
      const std::string dir = ckpt::resolve(co->ckpt);
      ckpt::Reader reader(dir);
      const auto& train = reader.manifest().at("config").at("train");
      const int64_t seq = train.at("seq").get<int64_t>();
      std::string tokenizer;
      if (!co->tasks.empty()) tokenizer = run_tokenizer(co->tokenizer, train.value("data", std::vector<std::string>{}));
      std::vector<std::vector<TokenizedChoice>> tasks;
      const int64_t vocab = reader.manifest().at("config").at("model").at("vocab").get<int64_t>();
      for (const auto& t : co->tasks) {  // every file checked first
        tasks.push_back(tokenize_choice_task(t, tokenizer));
        check_choice_ids(tasks.back(), vocab, t);
      }
      for (const auto& shard : co->data) ShardReader{shard};  // every file checked before the model loads
      namespace fs = std::filesystem;
      if (!co->samples.empty() && (co->tasks.empty() || fs::exists(co->samples))) {
        throw std::invalid_argument(co->tasks.empty()
                                        ? "--log-samples writes the --task questions' scores: give --task"
                                        : fmt::format("--log-samples {} exists: remove it or name a new file", co->samples));
      }
      Comm solo("tp", 0);
      auto model = load_for_inference(dir, solo);
      for (const auto& shard : co->data) {
        const ShardLoss l = shard_loss(*model, shard, seq);
        fmt::print("{}: {}: loss {:.4f} | perplexity {:.2f} ({} windows of {} tokens)\n", dir, shard, l.mean(),
                   std::exp(l.mean()), l.windows, seq);
      }
      std::string samples;
      for (size_t i = 0; i < tasks.size(); ++i) {
        const auto lls = choice_loglikelihoods(*model, tasks[i], seq);
        for (size_t q = 0; q < lls.size(); ++q) {
          samples += choice_sample_line(choice_task_name(co->tasks[i]), tasks[i][q], lls[q]) + "\n";
        }
        const ChoiceScore s = score_choices(tasks[i], lls);
        fmt::print("{}: task {}: acc {:.4f} | acc_norm {:.4f} | answer log-likelihood {:.6f} ({} questions)\n", dir,
                   choice_task_name(co->tasks[i]), s.acc(), s.acc_norm(), s.mean_answer_ll(), s.questions);
      }
      if (!co->samples.empty()) {  // whole or absent
        std::ofstream(co->samples + ".tmp") << samples;
        fs::rename(co->samples + ".tmp", co->samples);
      }
      return 0;
    }
    if (task->parsed()) {
      const auto env = make_environment(to->environment);
      if (to->max_turns < 1) throw std::invalid_argument(fmt::format("--max-turns {} must be >= 1", to->max_turns));
      const std::string dir = ckpt::resolve(to->ckpt);
      Comm solo("tp", 0);
      auto model = load_for_inference(dir, solo);
      const TaskScore s =
          evaluate_task(*model, read_task_examples(to->data), to->max_new, 64, 0, 0, env.get(), to->max_turns);
      fmt::print("{}: exact {}/{} = {:.3f}; mean reward {:.3f}\n", dir, s.exact, s.examples, s.accuracy(), s.reward);
      return 0;
    }
    namespace fs = std::filesystem;
    const fs::path info = fs::path(o->data).parent_path() / "sft.json";
    if (!fs::exists(info)) {
      throw std::invalid_argument(fmt::format("{} has no sft.json beside it: make it with meshtrain tokenize chat", o->data));
    }
    nlohmann::json j;
    std::ifstream(info) >> j;
    const std::string dir = ckpt::resolve(o->ckpt);
    Comm solo("tp", 0);
    auto model = load_for_inference(dir, solo, o->document_mask);
    const ExactMatch r = exact_match(*model, {o->data}, j.at("seq").get<int64_t>(), o->document_mask);
    fmt::print("{}: exact match {}/{} = {:.3f}; answer-token accuracy {}/{} = {:.3f}\n", dir, r.exact, r.answers,
               r.rate(), r.correct, r.targets, r.token_accuracy());
    return 0;
  };
}

}  // namespace meshtrain::cli
