// Streaming tokenization (data/stream_tokenize.h) through meshtrain-tokenize:
// its shards, concatenated, equal `meshtrain tokenize`'s in-memory output token
// for token (documents too), with 1 or 2 workers and from gzip JSON lines; an
// interrupted run resumes to the same shards; its peak memory does not grow
// with the corpus (measured on corpora of 1.2 and 12 MB).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/shard.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using test::Dir;

const std::string kBin = MESHTRAIN_BIN;
const std::string kHelper = (fs::path(MESHTRAIN_BIN).parent_path() / "meshtrain-tokenize").string();

// Lines of pseudo-verses: `n` documents, numbered so none repeats.
std::string corpus(int first, int n) {
  static const char* words[] = {"and", "the", "LORD", "said", "unto", "Moses", "behold", "land", "of", "Egypt",
                                "light", "waters", "was", "good", "evening", "morning", "day", "heaven", "earth"};
  std::string out;
  for (int i = first; i < first + n; ++i) {
    out += "Verse " + std::to_string(i);
    for (int w = 0; w < 8 + i % 13; ++w) out += std::string(" ") + words[(i * 7 + w * w) % 19];
    out += ".\n";
  }
  return out;
}

struct Tokens {
  std::vector<uint32_t> ids;
  std::vector<uint64_t> starts;
};
Tokens concat(const std::vector<std::string>& shards) {
  Tokens t;
  for (const auto& path : shards) {
    ShardReader r(path);
    for (uint64_t s : r.doc_starts()) t.starts.push_back(t.ids.size() + s);
    for (uint64_t i = 0; i < r.size(); ++i) t.ids.push_back(r[i]);
  }
  return t;
}
std::vector<std::string> shards_of(const fs::path& dir, const std::string& split) {
  nlohmann::json j;
  std::ifstream(dir / "index.json") >> j;
  return j.at(split).get<std::vector<std::string>>();
}
std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(StreamTokenize, EqualsTheInMemoryTokenizationWithAnyWorkersAndFormat) {
  Dir d;
  const std::string a = d.write("a.txt", corpus(0, 1500)), b = d.write("b.txt", corpus(1500, 900));
  // The in-memory tokenization trains the tokenizer; the streams reuse it.
  auto run = test::run_command(kBin + " tokenize --input " + a + " --input " + b + " --out " + (d.path / "mem").string() +
                               " --vocab-size 400 --val-fraction 0.01");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string model = (d.path / "mem/tokenizer.model").string();
  const Tokens train = concat({(d.path / "mem/train.bin").string()}), val = concat({(d.path / "mem/val.bin").string()});
  // The same documents as gzip-compressed JSON lines.
  {
    gzFile gz = gzopen((d.path / "all.jsonl.gz").c_str(), "wb");
    std::istringstream lines(corpus(0, 1500) + corpus(1500, 900));
    for (std::string line; std::getline(lines, line);) {
      const std::string j = nlohmann::json{{"text", line}}.dump() + "\n";
      gzwrite(gz, j.data(), static_cast<unsigned>(j.size()));
    }
    gzclose(gz);
  }
  std::vector<std::string> first;
  for (const std::string& variant : {std::string("--input ") + a + " --input " + b + " --workers 1",
                                     std::string("--input ") + a + " --input " + b + " --workers 2",
                                     "--input " + (d.path / "all.jsonl.gz").string() + " --workers 2"}) {
    SCOPED_TRACE(variant);
    const fs::path out = d.path / ("s" + std::to_string(first.size() + 1));
    run = test::run_command(kHelper + " stream " + variant + " --out " + out.string() + " --tokenizer " + model +
                            " --shard-tokens 5000 --chunk-bytes 4096 --val-fraction 0.01");
    ASSERT_EQ(run.code, 0) << run.output;
    const auto shards = shards_of(out, "train");
    ASSERT_GT(shards.size(), 3u);
    for (const auto& s : shards) EXPECT_LE(ShardReader(s).size(), 5000u) << s;  // bounded, whole documents
    const Tokens t = concat(shards), v = concat(shards_of(out, "val"));
    EXPECT_EQ(t.ids, train.ids);
    EXPECT_EQ(t.starts, train.starts);
    EXPECT_EQ(v.ids, val.ids);
    EXPECT_EQ(v.starts, val.starts);
    std::string all;
    for (const auto& s : shards) all += bytes_of(s);
    first.push_back(all);
  }
  EXPECT_EQ(first[0], first[1]);  // the shards do not depend on the workers
  EXPECT_EQ(first[0], first[2]);
  // A tokenizer trained on a sample of the stream.
  run = test::run_command(kHelper + " stream --input " + a + " --out " + (d.path / "sampled").string() +
                          " --vocab-size 320 --sample-bytes 20000");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_TRUE(fs::exists(d.path / "sampled/tokenizer.model"));
  EXPECT_FALSE(shards_of(d.path / "sampled", "train").empty());
}

TEST(StreamTokenize, AnInterruptedRunResumesToTheSameShards) {
  Dir d;
  const std::string a = d.write("a.txt", corpus(0, 3000));
  auto run = test::run_command(kBin + " tokenize --input " + a + " --out " + (d.path / "mem").string() + " --vocab-size 400");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string common = " --input " + a + " --tokenizer " + (d.path / "mem/tokenizer.model").string() +
                             " --shard-tokens 4000 --chunk-bytes 2048 --workers 2";
  run = test::run_command(kHelper + " stream --out " + (d.path / "straight").string() + common);
  ASSERT_EQ(run.code, 0) << run.output;
  const fs::path cut = d.path / "cut";
  run = test::run_command("MESHTRAIN_TOKENIZE_EXIT_AFTER_SHARDS=3 " + kHelper + " stream --out " + cut.string() + common);
  ASSERT_EQ(run.code, 3) << run.output;  // stopped right after its third shard
  EXPECT_TRUE(fs::exists(cut / "progress.json"));
  EXPECT_FALSE(fs::exists(cut / "index.json"));
  // Other options on the interrupted directory: refused, nothing lost.
  run = test::run_command(kHelper + " stream --out " + cut.string() + common + " --val-fraction 0.1");
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_NE(run.output.find("an interrupted tokenization of other inputs or options"), std::string::npos) << run.output;
  run = test::run_command(kHelper + " stream --out " + cut.string() + common);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed after "), std::string::npos) << run.output;
  const auto straight = shards_of(d.path / "straight", "train"), resumed = shards_of(cut, "train");
  ASSERT_EQ(straight.size(), resumed.size());
  ASSERT_GT(straight.size(), 4u);
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(bytes_of(straight[i]), bytes_of(resumed[i])) << i;
  EXPECT_EQ(bytes_of(shards_of(d.path / "straight", "val")[0]), bytes_of(shards_of(cut, "val")[0]));
  // Finished: a rerun is refused without --force.
  run = test::run_command(kHelper + " stream --out " + cut.string() + common);
  EXPECT_NE(run.output.find("holds a finished tokenization"), std::string::npos) << run.output;
  // Bad input names the file.
  const std::string empty = d.write("empty.txt", "");
  run = test::run_command(kHelper + " stream --out " + (d.path / "e").string() + " --input " + empty + " --tokenizer " +
                          (d.path / "mem/tokenizer.model").string());
  EXPECT_EQ(run.code, 1);
  EXPECT_NE(run.output.find(empty + ": empty file"), std::string::npos) << run.output;
}

// Peak resident memory (kB) of the helper, as it reports it (VmHWM: its own since exec).
long peak_kib(const std::string& command) {
  const auto run = test::run_command(command);
  EXPECT_EQ(run.code, 0) << run.output;
  const size_t at = run.output.find("peak resident memory ");
  if (at == std::string::npos) {
    ADD_FAILURE() << run.output;
    return 0;
  }
  return std::stol(run.output.substr(at + 21));
}

TEST(StreamTokenize, MemoryDoesNotGrowWithTheCorpus) {
  Dir d;
  const std::string small = d.write("small.txt", corpus(0, 20000));  // ~1.2 MB
  {
    std::ofstream big(d.path / "big.txt");
    for (int k = 0; k < 10; ++k) big << corpus(k * 20000, 20000);  // ~12 MB: 10x, 150x the buffers below
  }
  auto run = test::run_command(kBin + " tokenize --input " + small + " --out " + (d.path / "mem").string() +
                               " --vocab-size 400");
  ASSERT_EQ(run.code, 0) << run.output;
  auto args = [&](const std::string& in, const std::string& out) {
    return kHelper + " stream --input " + in + " --out " + (d.path / out).string() + " --tokenizer " +
           (d.path / "mem/tokenizer.model").string() + " --shard-tokens 20000 --chunk-bytes 65536";
  };
  const long small_kib = peak_kib(args(small, "s")), big_kib = peak_kib(args((d.path / "big.txt").string(), "b"));
  std::cout << "peak RSS: small corpus " << small_kib << " KiB, big " << big_kib << " KiB\n";
  // The in-memory path would hold the 12 MB of text and its ~3M ids (12 MB more) at once.
  EXPECT_LT(big_kib, small_kib + 4096) << "small " << small_kib << " KiB, big " << big_kib << " KiB";
  EXPECT_GT(shards_of(d.path / "b", "train").size(), 100u);
}

}  // namespace
}  // namespace meshtrain
