// Data mixtures (data/mixture.h through TokenLoader): the blend's proportions
// hold within 1% of the weights over 10,000 windows (and at every prefix), the
// ranks together read what one process would, each source cycles through its
// own windows, a restored state resumes every source exactly, and bad sources
// in a config are one error naming the key and its line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/data/loader.h"
#include "meshtrain/data/mixture.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct MixDir {
  fs::path path = fs::temp_directory_path() / ("meshtrain_mixture_" + std::to_string(getpid()));
  MixDir() { fs::create_directories(path); }
  ~MixDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Source i's tokens are 1000 i + (position % 997): a window's first token names its source.
std::vector<MixtureSource> three_sources(const MixDir& d, std::vector<double> weights, std::vector<uint32_t> sizes) {
  std::vector<MixtureSource> out;
  for (size_t i = 0; i < weights.size(); ++i) {
    std::vector<uint32_t> tokens(sizes[i]);
    for (uint32_t t = 0; t < sizes[i]; ++t) tokens[t] = 1000 * static_cast<uint32_t>(i) + t % 997;
    const std::string path = d.file("s" + std::to_string(i) + ".bin");
    write_shard(path, tokens, {0}, 2);
    out.push_back({"s" + std::to_string(i), {path}, weights[i], {}});
  }
  return out;
}

TEST(Mixture, ProportionsWithinOnePercentOverTenThousandWindows) {
  MixDir d;
  // Weights 5 : 3 : 2 (relative). The small source (40 windows) runs through many epochs.
  const auto sources = three_sources(d, {5, 3, 2}, {20000, 6000, 321});
  const int64_t seq = 8, mb = 2, dp = 2;
  std::vector<TokenLoader> ranks;
  for (int r = 0; r < dp; ++r) ranks.emplace_back(sources, seq, mb, r, dp, 3);
  TokenLoader one(sources, seq, mb * dp, 0, 1, 3);
  std::vector<int64_t> count(3, 0);
  int64_t windows = 0;
  std::vector<std::set<uint64_t>> seen(3);
  for (int step = 0; step < 2500; ++step) {  // 2500 steps x 4 windows = 10,000
    Batch all = one.next();
    std::vector<int64_t> tokens;
    for (auto& r : ranks) {
      Batch b = r.next();
      ASSERT_EQ(b.tokens.size(0), mb);
      const auto t = b.tokens.contiguous();
      tokens.insert(tokens.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
      EXPECT_TRUE(b.targets.narrow(1, 0, seq - 1).equal(b.tokens.narrow(1, 1, seq - 1)));
    }
    const auto at = all.tokens.contiguous();
    ASSERT_EQ(tokens, std::vector<int64_t>(at.data_ptr<int64_t>(), at.data_ptr<int64_t>() + at.numel()))
        << "the ranks together read the single process's step " << step;
    for (int64_t row = 0; row < all.tokens.size(0); ++row) {
      const int64_t src = all.tokens[row][0].item<int64_t>() / 1000;
      ++count[src];
      ++windows;
      seen[src].insert(all.windows[row]);
    }
    for (int i = 0; i < 3; ++i) {  // at every prefix: within one window of its share (Megatron's rule)
      const double share = std::vector<double>{0.5, 0.3, 0.2}[i] * static_cast<double>(windows);
      ASSERT_LE(std::abs(static_cast<double>(count[i]) - share), 1.0 + 1e-9) << "source " << i << " step " << step;
    }
  }
  ASSERT_EQ(windows, 10000);
  EXPECT_NEAR(count[0] / 10000.0, 0.5, 0.01);
  EXPECT_NEAR(count[1] / 10000.0, 0.3, 0.01);
  EXPECT_NEAR(count[2] / 10000.0, 0.2, 0.01);
  // Every source's windows were all read; the small one's many times over.
  EXPECT_EQ(seen[0].size(), 2499u);  // (20000 - 1) / 8 windows, fewer than its 5000 reads
  EXPECT_EQ(seen[2].size(), 40u);
  const auto stats = one.source_stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[2].name, "s2");
  EXPECT_EQ(stats[2].taken, static_cast<uint64_t>(count[2]));
  EXPECT_EQ(stats[2].windows, 40u);
  EXPECT_DOUBLE_EQ(stats[2].epochs(), count[2] / 40.0);  // 50 epochs of the small source
  EXPECT_LT(stats[0].epochs(), 2.01);
}

TEST(Mixture, RestoredStateResumesEverySourceExactly) {
  MixDir d;
  const auto sources = three_sources(d, {0.6, 0.3, 0.1}, {3000, 2000, 500});
  TokenLoader straight(sources, 16, 3, 1, 2, 9);
  std::vector<Batch> want;
  for (int i = 0; i < 120; ++i) want.push_back(straight.next());  // every source past an epoch boundary
  TokenLoader first(sources, 16, 3, 1, 2, 9);
  for (int i = 0; i < 53; ++i) first.next();
  const LoaderState saved = first.state();
  EXPECT_EQ(saved.epoch, 0u);
  EXPECT_EQ(saved.step, 53u);
  TokenLoader resumed(sources, 16, 3, 1, 2, 9);
  resumed.restore(saved);
  EXPECT_EQ(resumed.source_stats()[1].taken, first.source_stats()[1].taken);
  for (int i = 53; i < 120; ++i) {
    Batch b = resumed.next();
    ASSERT_EQ(b.windows, want[i].windows) << "step " << i;
    ASSERT_TRUE(b.tokens.equal(want[i].tokens)) << "step " << i;
  }
  EXPECT_GT(straight.source_stats()[2].epochs(), 1.0);
  // Another seed: another order within each source.
  TokenLoader other(sources, 16, 3, 1, 2, 10);
  EXPECT_FALSE(other.next().tokens.equal(want[0].tokens));
}

std::string config_error(const std::string& data) {
  MixDir d;
  const std::string path = d.file("m.toml");
  {
    std::ofstream f(path);
    f << "[model]\npreset = \"gpt-tiny\"\n[data]\n" << data << "\n";
  }
  try {
    load_train_config(path, {});
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Mixture, BadSourcesAreOneErrorNamingTheKeyAndLine) {
  const std::string a = R"({name = "a", path = "a.bin", weight = 0.7})";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\", weight = 0}\n]",
       "data.sources[1] (line 6): weight 0 must be a positive finite number"},
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\", weight = -2}\n]",
       "data.sources[1] (line 6): weight -2 must be a positive finite number"},
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\", weight = nan}\n]",
       "data.sources[1] (line 6): weight nan must be a positive finite number"},
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\", weight = \"half\"}\n]",
       "data.sources[1] (line 6).weight must be a number"},
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\"}\n]", "data.sources[1] (line 6): no weight"},
      {"sources = [\n  " + a + ",\n  {name = \"a\", path = \"b.bin\", weight = 1}\n]", "the name \"a\" is used twice"},
      {"sources = [\n  " + a + ",\n  {name = \"b\", path = \"b.bin\", weight = 1, wieght = 2}\n]",
       "unknown key 'wieght'"},
      {"train = \"x.bin\"\nsources = [" + a + "]", "give data.train or data.sources, not both"},
  };
  for (const auto& [data, want] : cases) {
    SCOPED_TRACE(data);
    const std::string e = config_error(data);
    EXPECT_NE(e.find("m.toml"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
}

TEST(Mixture, UnreadableOrEmptySourcesNameTheFile) {
  MixDir d;
  auto sources = three_sources(d, {1, 1}, {3000, 3000});
  std::ofstream(d.file("empty.bin")).flush();
  for (const auto& [path, want] : std::vector<std::pair<std::string, std::string>>{
           {d.file("missing.bin"), "cannot open token shard " + d.file("missing.bin")},
           {d.file("empty.bin"), "token shard " + d.file("empty.bin") + ": the file is empty"}}) {
    sources[1].shards = {path};
    try {
      TokenLoader(sources, 16, 2, 0, 1, 1);
      ADD_FAILURE() << path << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Mixture, PrintConfigWritesTheSourcesBack) {
  MixDir d;
  const std::string path = d.file("m.toml"), again = d.file("again.toml");
  std::ofstream(path) << "[model]\npreset = \"gpt-tiny\"\n[data]\nsources = [{name = \"a\", path = [\"a.bin\", \"b.bin\"], "
                         "weight = 0.7, val = \"v.bin\"}, {name = \"c\", path = \"c.bin\", weight = 3}]\n";
  const TrainConfig c = load_train_config(path, {});
  std::ofstream(again) << print_config(c);
  const TrainConfig back = load_train_config(again, {});
  ASSERT_EQ(back.sources.size(), 2u);
  EXPECT_EQ(back.sources[0].shards, (std::vector<std::string>{"a.bin", "b.bin"}));
  EXPECT_EQ(back.sources[0].val, std::vector<std::string>{"v.bin"});
  EXPECT_EQ(back.sources[0].weight, 0.7);
  EXPECT_EQ(back.sources[1].name, "c");
  EXPECT_EQ(back.sources[1].weight, 3);
  EXPECT_EQ(train_shards_of(back), (std::vector<std::string>{"a.bin", "b.bin", "c.bin"}));
}

}  // namespace
}  // namespace meshtrain
