// meshtrain data filter INPUT... --out PATH [--format auto|text|jsonl] [--field text] [--split blank-line|line|file]
//                        [--no-exact] [--no-near] [--no-quality] [--threshold 0.8] [--ngram 5] [--bands 14]
//                        [--rows 8] [--min-words 50] [--no-repetition] [--examples 3] [--force]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "cli/commands.h"
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
  auto cmd = app.add_subcommand("data", "corpus tools: deduplication and quality filters");
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
  return [o]() {
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
