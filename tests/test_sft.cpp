// Supervised fine-tuning data (data/chat.h) and its path through training: the
// chat template and which tokens train; packing keeps conversations whole
// (padding masked, each block starting a conversation) and names a conversation
// longer than the sequence; the loader turns masked targets into -1 (zero loss,
// zero gradient) without touching the inputs; and `meshtrain tokenize chat` +
// `meshtrain train` with train.method = "sft" run end to end, refusing data
// packed for another length.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/Functions.h>

#include "meshtrain/data/chat.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/shard.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain::test {
namespace {

const nlohmann::json kChat = nlohmann::json::parse(
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Quote Genesis 1:3"},
                     {"role": "assistant", "content": "Let there be light."}]})");

TEST(Sft, TemplateMarksAssistantTokensOnly) {
  const auto segs = render_chat(kChat);
  ASSERT_EQ(segs.size(), 4u);
  std::string text, trained;
  for (const auto& s : segs) {
    text += s.text;
    if (s.train) trained += s.text;
  }
  EXPECT_EQ(text, "<|system|>\nBe brief.<|end|>\n<|user|>\nQuote Genesis 1:3<|end|>\n<|assistant|>\nLet there be "
                  "light.<|end|>\n");
  EXPECT_EQ(trained, "Let there be light.<|end|>\n");
  ChatTemplate t;
  t.assistant = "A: ";
  t.end = "\n";
  EXPECT_EQ(render_chat(kChat, t).at(2).text, "A: ");
  for (const char* bad : {R"({"messages": [{"role": "robot", "content": "x"}]})", R"({"turns": []})",
                          R"({"messages": [{"role": "user", "content": "only a question"}]})",
                          R"({"messages": [{"role": "assistant"}]})"}) {
    EXPECT_THROW(render_chat(nlohmann::json::parse(bad)), std::invalid_argument) << bad;
  }
}

TEST(Sft, TemplateRoundTrips) {
  auto text = [](const nlohmann::json& chat, const ChatTemplate& t) {
    std::string out;
    for (const auto& seg : render_chat(chat, t)) out += seg.text;
    return out;
  };
  EXPECT_EQ(parse_chat(text(kChat, {})), kChat);
  ChatTemplate llama{"<<SYS>>", "[INST]", "[/INST]", "</s>"};  // other markers, the same round trip
  EXPECT_EQ(parse_chat(text(kChat, llama), llama), kChat);
  const auto multi = nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "a\nb"},
      {"role": "assistant", "content": ""}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})");
  EXPECT_EQ(parse_chat(text(multi, {})), multi);
  // Content that holds a marker could not be parsed back: refused when rendering.
  const auto bad = nlohmann::json::parse(R"({"messages": [{"role": "assistant", "content": "x<|end|>\ny"}]})");
  EXPECT_THROW(render_chat(bad), std::invalid_argument);
  EXPECT_THROW(parse_chat("<|user|>\nno end"), std::invalid_argument);
  EXPECT_THROW(parse_chat("plain text"), std::invalid_argument);
}

TEST(Sft, PackingKeepsConversationsWhole) {
  auto chat = [](int64_t line, uint32_t n) {
    TokenizedChat c;
    c.line = line;
    for (uint32_t i = 0; i < n; ++i) {
      c.ids.push_back(10 * static_cast<uint32_t>(line) + i);
      c.mask.push_back(i >= n / 2);
    }
    return c;
  };
  // seq 8: [5 | 3 pad] [6 | 2 pad] [8] [3 | 5 pad] + the closing token
  const PackedChats p = pack_chats({chat(1, 5), chat(2, 6), chat(3, 8), chat(4, 3)}, 8, 0, false);
  EXPECT_EQ(p.tokens.size(), 4u * 8 + 1);
  EXPECT_EQ(p.conversations, 4u);
  EXPECT_EQ(p.padding, 3u + 2 + 5);
  for (uint64_t b = 0; b < 4; ++b) EXPECT_EQ(p.tokens[b * 8] % 10, 0u) << "block " << b << " starts a conversation";
  for (size_t i = 0; i < p.tokens.size(); ++i) {
    if (p.tokens[i] == 0 && i % 8 != 0) EXPECT_EQ(p.mask[i], 0u) << "padding is never trained";
  }
  EXPECT_EQ(p.doc_starts, (std::vector<uint64_t>{0, 5, 8, 14, 16, 24, 27, 32}));
  try {
    pack_chats({chat(1, 5), chat(7, 9)}, 8, 0, false);
    ADD_FAILURE() << "a conversation longer than seq was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("conversation on line 7 has 9 tokens, more than --seq 8"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pack_chats({chat(7, 9)}, 8, 0, true).truncated, 1u);
}

// Repacking (data/loader.h): every conversation once per epoch, whole, in a
// new order each epoch; rows never exceed the sequence; dp ranks split one
// process's rows; a restored state continues on the same batch.
TEST(Sft, RepackingShufflesConversationsEachEpoch) {
  Dir d;
  std::vector<TokenizedChat> chats;
  for (uint32_t c = 1; c <= 11; ++c) {
    TokenizedChat t;
    t.line = c;
    const uint32_t n = 2 + c % 5;  // 2..6 tokens
    for (uint32_t i = 0; i < n; ++i) {
      t.ids.push_back(100 * c + i);
      t.mask.push_back(i > 0);
    }
    chats.push_back(t);
  }
  const PackedChats p = pack_chats(chats, 8, 7, false);
  write_shard((d.path / "r.bin").string(), p.tokens, p.doc_starts, 2);
  write_shard((d.path / "r.mask.bin").string(), p.mask, p.doc_starts, 2);
  const std::string shard = (d.path / "r.bin").string();
  LoaderOptions o{true, true, 1};
  o.repack = true;
  TokenLoader one({shard}, 8, 2, 0, 1, 3, o), r0({shard}, 8, 1, 0, 2, 3, o), r1({shard}, 8, 1, 1, 2, 3, o);
  EXPECT_EQ(one.windows(), 11u);
  std::vector<std::vector<uint32_t>> orders;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<uint32_t> seen;
    const uint64_t steps = one.steps_per_epoch();
    for (uint64_t s = 0; s < steps; ++s) {
      const Batch b = one.next(), a = r0.next(), c = r1.next();
      EXPECT_TRUE(at::equal(at::cat({a.tokens, c.tokens}), b.tokens));
      for (int64_t row = 0; row < 2; ++row) {
        for (int64_t j = 0; j < 8; ++j) {
          const int64_t t = b.tokens[row][j].item<int64_t>();
          if (t == 7) {  // padding: nothing trains after a pad input, and its document is the last
            EXPECT_EQ(b.targets[row][j].item<int64_t>(), -1);
            continue;
          }
          if (t % 100 == 0) seen.push_back(static_cast<uint32_t>(t / 100));  // a conversation starts
          // Within a conversation the next token trains (mask 1), and only its own.
          const int64_t next = j + 1 < 8 ? b.tokens[row][j + 1].item<int64_t>() : -2;
          const int64_t want = next != 7 && next != -2 && next / 100 == t / 100 ? next : -1;
          if (next != -2) EXPECT_EQ(b.targets[row][j].item<int64_t>(), want) << row << " " << j;
          if (j > 0) EXPECT_GE(b.doc_ids[row][j].item<int64_t>(), b.doc_ids[row][j - 1].item<int64_t>());
        }
      }
    }
    // Leftover rows (fewer than a global batch) are skipped: most conversations, each at most once.
    std::set<uint32_t> unique(seen.begin(), seen.end());
    EXPECT_EQ(unique.size(), seen.size()) << "a conversation twice in epoch " << epoch;
    EXPECT_GE(seen.size(), 8u);
    orders.push_back(seen);
  }
  EXPECT_NE(orders[0], orders[1]) << "the same order in two epochs";
  // Restore: the state after 2 steps continues where it was.
  TokenLoader a({shard}, 8, 2, 0, 1, 3, o), b({shard}, 8, 2, 0, 1, 3, o);
  a.next();
  a.next();
  b.restore(a.state());
  EXPECT_TRUE(at::equal(a.next().tokens, b.next().tokens));
}

TEST(Sft, LoaderIgnoresMaskedTargetsOnly) {
  Dir d;
  std::vector<uint32_t> tokens(65), mask(65);
  for (uint32_t i = 0; i < 65; ++i) {
    tokens[i] = 100 + i;
    mask[i] = (i / 4) % 2;  // runs of 4 trained, 4 not
  }
  write_shard((d.path / "s.bin").string(), tokens, {0}, 2);
  write_shard((d.path / "s.mask.bin").string(), mask, {0}, 2);
  TokenLoader l({(d.path / "s.bin").string()}, 8, 2, 0, 1, 5, {false, true});
  for (int step = 0; step < 4; ++step) {
    const Batch b = l.next();
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t pos = b.tokens[r][j].item<int64_t>() - 100;  // the input token's index
        EXPECT_EQ(b.targets[r][j].item<int64_t>(), mask[pos + 1] ? 100 + pos + 1 : -1) << pos;
      }
    }
  }
  // One row per batch: the inputs stay untouched (targets once were a view of them).
  TokenLoader one({(d.path / "s.bin").string()}, 8, 1, 0, 1, 5, {false, true});
  for (int step = 0; step < 8; ++step) {
    const Batch b = one.next();
    EXPECT_GE(b.tokens.min().item<int64_t>(), 100) << "a masked target overwrote an input";
    EXPECT_EQ(b.tokens[0][7].item<int64_t>() - b.tokens[0][0].item<int64_t>(), 7);
  }
  std::filesystem::remove(d.path / "s.mask.bin");
  EXPECT_THROW(TokenLoader({(d.path / "s.bin").string()}, 8, 2, 0, 1, 5, {false, true}), std::runtime_error);
}

TEST(Sft, TokenizeChatAndTrain) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string tokenizer = tiny_tokenizer(d, bin);
  {
    std::ofstream c(d.path / "chats.jsonl");
    for (int i = 0; i < 40; ++i) {
      c << nlohmann::json{{"messages", {{{"role", "user"}, {"content", "Quote verse " + std::to_string(i % 9)}},
                                        {{"role", "assistant"}, {"content", "In the beginning God created " +
                                                                                std::to_string(i % 17)}}}}}
                .dump()
        << "\n";
    }
  }
  auto run = run_command(bin + " tokenize chat --input " + (d.path / "chats.jsonl").string() + " --tokenizer " +
                    tokenizer + " --out " + (d.path / "sft").string() + " --seq 64");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("40 conversations -> "), std::string::npos) << run.output;
  const std::string cfg = d.write("sft.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 400\ndropout = 0.0\n"
                                              "attention = \"tiled\"\n[data]\ntrain = \"" +
                                                  (d.path / "sft/train.bin").string() +
                                                  "\"\n[train]\nmethod = \"sft\"\ndocument_mask = true\nsteps = 3\n"
                                                  "micro_batch = 2\nglobal_batch = 4\nseq = 64\nlog_every = 1\n"
                                                  "[parallel]\nnproc = 2\n");
  run = run_command(bin + " train " + cfg);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("step     3 | loss"), std::string::npos) << run.output;
  run = run_command(bin + " train " + cfg + " --set train.seq=32");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("was packed into blocks of 64 tokens but train.seq = 32"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace meshtrain::test
