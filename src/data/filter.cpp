#include "meshtrain/data/filter.h"

#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace meshtrain {
namespace {

std::string snippet(const std::string& text) {
  std::string s = text.substr(0, 160);
  for (char& c : s)
    if (c == '\n') c = ' ';
  return text.size() > 160 ? s + "..." : s;
}

}  // namespace

FilterReport filter_corpus(const std::vector<std::string>& inputs, const std::string& output, const FilterOptions& o) {
  namespace fs = std::filesystem;
  if (output.empty()) throw std::invalid_argument("--out is needed: the filtered copy's path");
  if (fs::exists(output) && !o.force) {
    throw std::invalid_argument(fmt::format("{} exists; pass --force to replace it", output));
  }
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::equivalent(in, output, ec)) throw std::invalid_argument(fmt::format("--out {} is an input", output));
  }
  const auto t0 = std::chrono::steady_clock::now();
  DocumentReader reader(inputs, o.format);  // checks every input before anything is written
  const MinHasher hasher(o.minhash);
  NearDuplicateIndex index(o.minhash);
  const bool jsonl_out = output.size() > 6 && output.substr(output.size() - 6) == ".jsonl";
  const std::string sep = o.format.split == "line" ? "\n" : "\n\n";
  const std::string tmp = output + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  if (!out) throw std::invalid_argument(fmt::format("{}: cannot be written", tmp));

  FilterReport r;
  struct RemoveUnlessDone {  // an error mid-corpus leaves no partial copy behind
    const std::string& path;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ec;
      if (!done) fs::remove(path, ec);
    }
  } cleanup{tmp};
  std::unordered_set<uint64_t> seen;                  // exact: normalised-text hashes
  std::unordered_map<int64_t, std::string> kept_where;  // near: a kept document's place, for the report
  auto remove = [&](const std::string& reason, const Document& d, std::string detail) {
    ++r.removed[reason];
    auto& ex = r.examples[reason];
    if (static_cast<int>(ex.size()) < o.examples) ex.push_back({d.where, snippet(d.text), std::move(detail)});
  };
  Document d;
  bool first = true;
  while (reader.next(d)) {
    const int64_t id = r.documents++;
    const std::string norm = normalize_text(d.text);
    if (o.exact && !seen.insert(XXH3_64bits(norm.data(), norm.size())).second) {
      remove("exact_duplicate", d, "");
      continue;
    }
    if (o.quality) {
      const QualityVerdict v = check_quality(d.text, o.rules);
      if (!v.ok()) {
        remove(v.rule, d, v.detail);
        continue;
      }
    }
    if (o.near) {
      if (auto m = index.check_and_add(id, hasher.signature(norm))) {
        remove("near_duplicate", d, fmt::format("estimated Jaccard {:.2f} with {}", m->estimated, kept_where.at(m->id)));
        continue;
      }
      kept_where.emplace(id, d.where);
    }
    ++r.kept;
    std::string line;
    if (jsonl_out) {
      line = d.jsonl ? d.raw : nlohmann::json{{"text", d.text}, {"source", d.where}}.dump();
      line += '\n';
    } else {
      line = (first ? "" : sep) + d.text;
    }
    first = false;
    out << line;
    r.bytes_out += static_cast<int64_t>(line.size());
  }
  if (!jsonl_out && !first) out << '\n', ++r.bytes_out;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("{}: write failed", tmp));
  fs::rename(tmp, output);
  cleanup.done = true;
  r.bytes_in = reader.bytes_read();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string FilterReport::text() const {
  std::string s = fmt::format("{} documents read ({:.1f} MB), {} kept ({:.1f}%), {} removed; {:.2f} s, {:.0f} documents/s\n",
                              documents, bytes_in / 1e6, kept, documents ? 100.0 * kept / documents : 0.0,
                              documents - kept, seconds, seconds > 0 ? documents / seconds : 0.0);
  for (const auto& [reason, n] : removed) {
    s += fmt::format("  {:<22} {:>8}  ({:.2f}%)\n", reason, n, 100.0 * n / std::max<int64_t>(documents, 1));
    for (const auto& e : examples.at(reason)) {
      s += fmt::format("      {}: \"{}\"{}\n", e.where, e.text, e.detail.empty() ? "" : " -- " + e.detail);
    }
  }
  return s;
}

nlohmann::json FilterReport::json() const {
  nlohmann::json j = {{"documents", documents}, {"kept", kept},       {"bytes_in", bytes_in},
                      {"bytes_out", bytes_out}, {"seconds", seconds}, {"removed", removed}};
  for (const auto& [reason, list] : examples)
    for (const auto& e : list) j["examples"][reason].push_back({{"where", e.where}, {"text", e.text}, {"detail", e.detail}});
  return j;
}

}  // namespace meshtrain
