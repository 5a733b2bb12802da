// meshtrain data filter INPUT... --out PATH [--format auto|text|jsonl] [--field text] [--split blank-line|line|file]
//                        [--no-exact] [--no-near] [--no-quality] [--threshold 0.8] [--ngram 5] [--bands 14]
//                        [--rows 8] [--min-words 50] [--no-repetition] [--examples 3] [--force]
// meshtrain data choices INPUT... --out TASK.jsonl [--held-out 0.005] [--questions N] [--choices 4]
//                        [--min-words 8] [--seed 1] [--format ...] [--field text] [--split line] [--force]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "meshtrain/data/ending_task.h"
#include "meshtrain/data/filter.h"

namespace meshtrain::cli {

Run add_data(CLI::App& app) {
  struct Opts {
    std::vector<std::string> inputs;
    std::string out;
    FilterOptions f;
    bool no_exact = false, no_near = false, no_quality = false, no_repetition = false;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("data", "corpus tools: deduplication and quality filters, an evaluation task");
  cmd->require_subcommand(1);
  auto filter = cmd->add_subcommand(
      "filter", "a filtered copy of a corpus (exact and near duplicates, Gopher-style quality rules) and its report");
  filter->add_option("inputs", o->inputs, "text or JSON-lines files (.gz too)")->required();
  filter->add_option("--out", o->out, "the filtered copy (.jsonl: JSON lines); its report goes to OUT.report.json")
      ->required();
  filter->add_option("--format", o->f.format.format, "auto | text | jsonl")->capture_default_str();
  filter->add_option("--field", o->f.format.field, "JSON lines: the text field")->capture_default_str();
  filter->add_option("--split", o->f.format.split, "text: blank-line | line | file")->capture_default_str();
  filter->add_flag("--no-exact", o->no_exact, "keep exact duplicates");
  filter->add_flag("--no-near", o->no_near, "keep near duplicates");
  filter->add_flag("--no-quality", o->no_quality, "skip the quality rules");
  filter->add_flag("--no-repetition", o->no_repetition, "skip the repetition rules only");
  filter->add_option("--threshold", o->f.minhash.threshold, "near duplicates: estimated Jaccard at or above")
      ->capture_default_str();
  filter->add_option("--ngram", o->f.minhash.ngram, "near duplicates: words per shingle")->capture_default_str();
  filter->add_option("--bands", o->f.minhash.bands, "MinHash LSH bands")->capture_default_str();
  filter->add_option("--rows", o->f.minhash.rows, "MinHash rows per band")->capture_default_str();
  filter->add_option("--min-words", o->f.rules.min_words, "quality: fewest words")->capture_default_str();
  filter->add_option("--max-words", o->f.rules.max_words, "quality: most words")->capture_default_str();
  filter->add_option("--min-stop-words", o->f.rules.min_stop_words, "quality: fewest English stop words")
      ->capture_default_str();
  filter->add_option("--examples", o->f.examples, "examples per reason in the report")->capture_default_str();
  filter->add_flag("--force", o->f.force, "replace an existing --out");
  struct ChoiceOpts {
    std::vector<std::string> inputs;
    std::string out;
    DocumentFormat format{"auto", "text", "line"};  // meshtrain tokenize's documents: the non-empty lines
    EndingTaskOptions t;
    bool force = false;
  };
  auto co = std::make_shared<ChoiceOpts>();
  auto choices = cmd->add_subcommand(
      "choices", "a multiple-choice task from a corpus's held-out documents: which ending completes each one "
                 "(for meshtrain eval --task; data/ending_task.h)");
  choices->add_option("inputs", co->inputs, "the corpus meshtrain tokenize read (text or JSON lines, .gz too)")
      ->required();
  choices->add_option("--out", co->out, "the task, JSON lines")->required();
  choices->add_option("--held-out", co->t.held_out, "the last fraction of the documents: tokenize's --val-fraction")
      ->capture_default_str();
  choices->add_option("--questions", co->t.questions, "questions at most (0: every usable held-out document)")
      ->capture_default_str();
  choices->add_option("--choices", co->t.choices, "choices per question")->capture_default_str();
  choices->add_option("--min-words", co->t.min_words, "words a document needs to be used")->capture_default_str();
  choices->add_option("--seed", co->t.seed, "order, distractors and the answer's place")->capture_default_str();
  choices->add_option("--format", co->format.format, "auto | text | jsonl")->capture_default_str();
  choices->add_option("--field", co->format.field, "JSON lines: the text field")->capture_default_str();
  choices->add_option("--split", co->format.split, "text: line | blank-line | file (as tokenize split it)")
      ->capture_default_str();
  choices->add_flag("--force", co->force, "replace an existing --out");
  return [o, co, choices]() {
    if (choices->parsed()) {
      if (std::filesystem::exists(co->out) && !co->force) {
        throw std::invalid_argument(fmt::format("{} exists; pass --force to replace it", co->out));
      }
      const EndingTask t = ending_task(held_out_documents(co->inputs, co->format, co->t.held_out), co->t);
      write_choice_task(t.items, co->out, co->force);
      fmt::print("{} documents, the last {} held out ({} shorter than {} words): {} questions of {} choices -> {}\n",
                 t.documents, t.held_out, t.short_documents, co->t.min_words, t.items.size(), co->t.choices, co->out);
      return 0;
    }
    o->f.exact = !o->no_exact, o->f.near = !o->no_near, o->f.quality = !o->no_quality;
    o->f.rules.repetition = !o->no_repetition;
    const FilterReport r = filter_corpus(o->inputs, o->out, o->f);
    const std::string report = o->out + ".report.json";
    std::ofstream(report) << r.json().dump(2) << "\n";
    fmt::print("{}wrote {} and {}\n", r.text(), o->out, report);
    return 0;
  };
}

}  // namespace meshtrain::cli
