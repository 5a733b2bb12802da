// Token shards and the loader: format round trip, clear errors for bad files,
// no overlap across ranks, exact resume, and a deterministic order.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <set>
#include <sys/wait.h>

#include "meshtrain/data/loader.h"
#include "meshtrain/data/validation.h"
#include "tests/run_command.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt_name();
  static std::string fmt_name() { return "meshtrain_data_" + std::to_string(::getpid()) + "_" + std::to_string(rand()); }
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<uint32_t> ramp(uint32_t n, uint32_t mod) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = i % mod;
  return t;
}

std::string error_of(const std::string& path) {
  try {
    ShardReader r(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Shard, RoundTripBothWidths) {
  TempDir d;
  for (int width : {2, 4}) {
    auto tokens = ramp(1000, width == 2 ? 65536 : 100000);
    tokens[7] = width == 2 ? 65535 : 4000000000u;
    write_shard(d.file("s.bin"), tokens, {0, 10, 500}, width);
    ShardReader r(d.file("s.bin"));
    ASSERT_EQ(r.size(), 1000u);
    EXPECT_EQ(r.token_bytes(), width);
    for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(r[i], tokens[i]);
    EXPECT_EQ(r.doc_starts(), (std::vector<uint64_t>{0, 10, 500}));
  }
  EXPECT_FALSE(fs::exists(d.file("s.bin.tmp")));
}

TEST(Shard, BadFilesAreClearErrors) {
  TempDir d;
  write_shard(d.file("good.bin"), ramp(100, 50), {0}, 2);
  EXPECT_NE(error_of(d.file("missing.bin")).find("cannot open"), std::string::npos);
  std::ofstream(d.file("empty.bin")).close();
  EXPECT_NE(error_of(d.file("empty.bin")).find("empty"), std::string::npos);
  fs::copy_file(d.file("good.bin"), d.file("trunc.bin"));
  fs::resize_file(d.file("trunc.bin"), fs::file_size(d.file("good.bin")) - 3);
  EXPECT_NE(error_of(d.file("trunc.bin")).find("truncated"), std::string::npos) << error_of(d.file("trunc.bin"));
  fs::copy_file(d.file("good.bin"), d.file("magic.bin"));
  {
    std::fstream f(d.file("magic.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.write("XXXX", 4);
  }
  EXPECT_NE(error_of(d.file("magic.bin")).find("wrong magic"), std::string::npos);
  EXPECT_THROW(write_shard(d.file("big.bin"), {70000}, {}, 2), std::invalid_argument);
  EXPECT_THROW(write_shard(d.file("none.bin"), {}, {}, 2), std::invalid_argument);
  EXPECT_THROW(write_shard(d.file("docs.bin"), {1, 2, 3}, {1}, 2), std::invalid_argument);
  // A document table written by someone else: starts past the tokens (SFT repacking read out of
  // bounds by them), descending, or not from 0 are refused when the shard is opened.
  write_shard(d.file("doc.bin"), ramp(100, 50), {0, 40, 80}, 2);
  const auto tail = fs::file_size(d.file("doc.bin")) - 3 * 8;  // the table ends the file
  for (const auto& [starts, want] : std::vector<std::pair<std::vector<uint64_t>, std::string>>{
           {{0, 40, 1000}, "document 2 starts at token 1000"},
           {{0, 80, 40}, "document 2 starts at token 40"},
           {{5, 40, 80}, "document 0 starts at token 5"}}) {
    {
      std::fstream f(d.file("doc.bin"), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(tail));
      f.write(reinterpret_cast<const char*>(starts.data()), 3 * 8);
    }
    EXPECT_NE(error_of(d.file("doc.bin")).find(want), std::string::npos) << error_of(d.file("doc.bin"));
  }
}

TEST(Loader, RanksPartitionTheGlobalBatch) {
  TempDir d;
  write_shard(d.file("a.bin"), ramp(1000, 1000), {0}, 2);
  write_shard(d.file("b.bin"), ramp(333, 1000), {0}, 2);
  const int64_t seq = 8, mb = 2;
  TokenLoader one({d.file("a.bin"), d.file("b.bin")}, seq, mb * 3, 0, 1, 5);
  std::vector<TokenLoader> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(std::vector<std::string>{d.file("a.bin"), d.file("b.bin")}, seq, mb, r, 3, 5);
  EXPECT_EQ(one.windows(), 999u / 8 + 332u / 8);
  std::set<uint64_t> seen;
  for (uint64_t step = 0; step < one.steps_per_epoch(); ++step) {
    Batch all = one.next();
    std::vector<uint64_t> joined;
    for (auto& r : ranks) {
      Batch b = r.next();
      joined.insert(joined.end(), b.windows.begin(), b.windows.end());
      EXPECT_TRUE(b.targets.narrow(1, 0, seq - 1).equal(b.tokens.narrow(1, 1, seq - 1)));
    }
    EXPECT_EQ(joined, all.windows) << "the ranks together see the single process's global batch";
    for (auto w : joined) EXPECT_TRUE(seen.insert(w).second) << "window " << w << " repeated within the epoch";
  }
  // Next epoch: a different order of the same windows.
  Batch e1 = one.next();
  EXPECT_EQ(one.state().epoch, 1u);
  EXPECT_EQ(e1.windows.size(), 6u);
}

// Where an epoch ends depends on the global batch alone: one process with the whole batch, or
// with accumulation, and 2, 3 or 4 data ranks with theirs read the same windows at every
// optimizer step, across epoch boundaries (165 windows: 13 global batches of 12, 9 left over).
TEST(Loader, EpochsEndOnTheSameOptimizerStepOnEveryMesh) {
  TempDir d;
  write_shard(d.file("a.bin"), ramp(1000, 1000), {0}, 2);
  write_shard(d.file("b.bin"), ramp(333, 1000), {0}, 2);
  const std::vector<std::string> shards{d.file("a.bin"), d.file("b.bin")};
  const int64_t seq = 8, global = 12, steps = 40;  // three epochs and a step into the fourth
  // Per optimizer step: the epoch it starts in and its windows, sorted (gradients are summed).
  auto run = [&](int dp, int64_t micro) {
    const int64_t acc = global / (micro * dp);
    LoaderOptions o;
    o.accumulation = acc;
    std::vector<TokenLoader> ranks;
    for (int r = 0; r < dp; ++r) ranks.emplace_back(shards, seq, micro, r, dp, 5, o);
    std::vector<std::pair<uint64_t, std::vector<uint64_t>>> out;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<uint64_t> windows;
      uint64_t epoch = 0;
      for (int64_t a = 0; a < acc; ++a) {
        for (auto& l : ranks) {
          Batch b = l.next();
          epoch = l.state().epoch;
          windows.insert(windows.end(), b.windows.begin(), b.windows.end());
        }
      }
      std::sort(windows.begin(), windows.end());
      out.emplace_back(epoch, windows);
    }
    return out;
  };
  const auto one = run(1, global);
  EXPECT_EQ(one[12].first, 0u);
  EXPECT_EQ(one[13].first, 1u) << "165 windows hold 13 global batches of 12";
  for (auto [dp, micro] : std::vector<std::pair<int, int64_t>>{{1, 2}, {2, 3}, {3, 2}, {4, 1}, {2, 6}}) {
    const auto other = run(dp, micro);
    for (int64_t s = 0; s < steps; ++s) {
      ASSERT_EQ(other[s], one[s]) << "dp " << dp << " micro-batch " << micro << ": optimizer step " << s;
    }
  }
}

// Validation is one set of windows on every mesh (data/validation.h): the first
// `count` of the epoch-0 order, each exactly once over the data ranks' calls,
// the rest of every call padded with rows that train nothing; DPO's pairs stay
// whole. 166 windows (83 pairs); counts 0 (all), 7 and 1.
TEST(Validation, EveryMeshCoversTheSameWindowsOnce) {
  TempDir d;
  write_shard(d.file("a.bin"), ramp(1000, 1000), {0}, 2);
  write_shard(d.file("b.bin"), ramp(337, 1000), {0}, 2);
  const std::vector<std::string> shards{d.file("a.bin"), d.file("b.bin")};
  for (int64_t group : {1, 2}) {
    LoaderOptions o;
    o.group = group;
    TokenLoader order(shards, 8, 1, 0, 1, 5, o);
    for (uint64_t count : {0, 7, 1}) {
      std::vector<uint64_t> want;
      const uint64_t units = count ? count : order.steps_per_epoch();
      for (uint64_t u = 0; u < units; ++u) {
        order.restore({0, u});
        const Batch b = order.next();
        want.insert(want.end(), b.windows.begin(), b.windows.end());
      }
      for (auto [dp, micro] : std::vector<std::pair<int, int64_t>>{{1, 1}, {1, 4}, {2, 3}, {3, 2}, {4, 1}}) {
        const std::string what = fmt::format("group {} count {} dp {} micro {}", group, count, dp, micro);
        std::vector<ValidationSet> ranks;
        for (int r = 0; r < dp; ++r) ranks.emplace_back(shards, 8, micro, 5, o, count, r, dp);
        ASSERT_EQ(ranks[0].units(), units) << what;
        const uint64_t per_call = static_cast<uint64_t>(micro * dp);
        EXPECT_EQ(ranks[0].calls(), (units + per_call - 1) / per_call) << what;
        std::vector<uint64_t> got;
        for (uint64_t k = 0; k < ranks[0].calls(); ++k) {
          for (auto& r : ranks) {
            const Batch b = r.batch(k);
            ASSERT_EQ(b.tokens.size(0), micro * group) << what;
            const int64_t real = static_cast<int64_t>(b.windows.size());
            got.insert(got.end(), b.windows.begin(), b.windows.end());
            for (int64_t row = real; row < b.tokens.size(0); ++row) {
              EXPECT_TRUE((b.targets[row] < 0).all().item<bool>()) << what << ": padded row " << row;
            }
            for (int64_t row = 0; row < real; ++row) {
              EXPECT_TRUE((b.targets[row] >= 0).all().item<bool>()) << what << ": row " << row;
            }
          }
        }
        EXPECT_EQ(got, want) << what;
      }
    }
  }
  try {
    ValidationSet(shards, 8, 2, 5, {}, 167, 0, 2);
    ADD_FAILURE() << "167 of 166 windows";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.eval_windows = 167 is more than the 166"), std::string::npos) << e.what();
  }
}

TEST(Loader, ResumeContinuesExactly) {
  TempDir d;
  write_shard(d.file("a.bin"), ramp(5000, 777), {0}, 2);
  TokenLoader straight({d.file("a.bin")}, 16, 4, 1, 2, 9);
  std::vector<Batch> want;
  for (int i = 0; i < 100; ++i) want.push_back(straight.next());  // crosses epoch boundaries
  TokenLoader first({d.file("a.bin")}, 16, 4, 1, 2, 9);
  for (int i = 0; i < 37; ++i) first.next();
  LoaderState saved = first.state();
  TokenLoader resumed({d.file("a.bin")}, 16, 4, 1, 2, 9);
  resumed.restore(saved);
  for (int i = 37; i < 100; ++i) {
    Batch b = resumed.next();
    ASSERT_EQ(b.windows, want[i].windows) << "step " << i;
    ASSERT_TRUE(b.tokens.equal(want[i].tokens));
  }
  LoaderState bad{0, 1000000};
  EXPECT_THROW(resumed.restore(bad), std::invalid_argument);
}

// With documents, every input position carries its document, renumbered from
// 0 in each window: token ramp(i) = i identifies the position, so the expected
// id is the number of document starts in (window start, position].
TEST(Loader, DocumentIdsFollowTheShardsDocumentStarts) {
  TempDir d;
  const std::vector<uint64_t> starts = {0, 10, 11, 40, 41, 42, 90};
  write_shard(d.file("a.bin"), ramp(100, 1000), starts, 2);
  TokenLoader l({d.file("a.bin")}, 16, 2, 0, 1, 3, {true});
  TokenLoader plain({d.file("a.bin")}, 16, 2, 0, 1, 3);
  EXPECT_FALSE(plain.next().doc_ids.defined());
  for (int step = 0; step < 3; ++step) {
    const Batch b = l.next();
    ASSERT_TRUE(b.doc_ids.defined());
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t first = b.tokens[r][0].item<int64_t>();
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t pos = b.tokens[r][j].item<int64_t>();
        int64_t want = 0;
        for (uint64_t s : starts) want += static_cast<int64_t>(s) > first && static_cast<int64_t>(s) <= pos;
        EXPECT_EQ(b.doc_ids[r][j].item<int64_t>(), want) << "window at " << first << ", position " << pos;
      }
    }
  }
}

TEST(Loader, TooLittleDataIsAClearError) {
  TempDir d;
  write_shard(d.file("tiny.bin"), ramp(20, 10), {0}, 2);
  try {
    TokenLoader l({d.file("tiny.bin")}, 16, 4, 0, 2, 1);
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one global batch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

std::string run_cmd(const std::string& cmd, int* code) {
  auto r = test::run_command(cmd);
  *code = r.code;
  return r.output;
}

TEST(Tokenize, TrainsATokenizerAndWritesShards) {
  TempDir d;
  {
    std::ofstream f(d.file("corpus.txt"));
    const char* words[] = {"the", "light", "was", "good", "and", "darkness", "upon", "face", "of", "deep", "waters"};
    for (int line = 0; line < 400; ++line) {
      for (int w = 0; w < 8; ++w) f << words[(line * 7 + w * 3) % 11] << (w < 7 ? " " : "\n");
      if (line % 50 == 49) f << "\n";  // blank lines are not documents
    }
  }
  int code = 0;
  std::string out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input " + d.file("corpus.txt") + " --out " +
                                d.file("tok") + " --vocab-size 400 --val-fraction 0.05",
                            &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("400 documents"), std::string::npos) << out;
  ShardReader train(d.file("tok/train.bin")), val(d.file("tok/val.bin"));
  EXPECT_EQ(train.doc_starts().size(), 380u);
  EXPECT_EQ(val.doc_starts().size(), 20u);
  EXPECT_EQ(train.token_bytes(), 2);
  uint64_t eos = 0;
  for (uint64_t i = 0; i < train.size(); ++i) eos += train[i] == 2;
  EXPECT_EQ(eos, 380u) << "one end-of-sequence id after each document";
  // Reusing the trained tokenizer gives the same tokens.
  out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input " + d.file("corpus.txt") + " --out " + d.file("tok2") +
                    " --tokenizer " + d.file("tok/tokenizer.model") + " --val-fraction 0.05",
                &code);
  ASSERT_EQ(code, 0) << out;
  ShardReader again(d.file("tok2/train.bin"));
  // An earlier tokenization is never overwritten by accident.
  out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input " + d.file("corpus.txt") + " --out " + d.file("tok2") +
                    " --tokenizer " + d.file("tok/tokenizer.model"),
                &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("train.bin already exists; pass --force"), std::string::npos) << out;
  ASSERT_EQ(again.size(), train.size());
  for (uint64_t i = 0; i < train.size(); ++i) ASSERT_EQ(again[i], train[i]);
}

TEST(Tokenize, BadInputIsAClearError) {
  TempDir d;
  int code = 0;
  std::string out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input /no/such.txt --out " + d.file("t"), &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("corpus file /no/such.txt does not exist"), std::string::npos) << out;
  out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input /etc/hostname --out " + d.file("t") + " --vocab-size 5",
                &code);
  EXPECT_NE(out.find("--vocab-size 5 must be"), std::string::npos) << out;
  // Corpora SentencePiece cannot learn from fail before it runs, and leave nothing behind.
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"", "has no text"}, {"just one line\n", "has 1 document(s): the validation split"}}) {
    std::ofstream(d.file("c.txt"), std::ios::trunc) << text;
    out = run_cmd(std::string(MESHTRAIN_BIN) + " tokenize --input " + d.file("c.txt") + " --out " + d.file("t2"), &code);
    EXPECT_NE(code, 0);
    EXPECT_NE(out.find(want), std::string::npos) << out;
    EXPECT_TRUE(!std::filesystem::exists(d.file("t2")) || std::filesystem::is_empty(d.file("t2"))) << out;
  }
}

}  // namespace
}  // namespace meshtrain
