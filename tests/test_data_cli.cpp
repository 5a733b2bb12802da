// Data and evaluation as a user runs them. Multiple-choice evaluation: [eval]
// tasks scored during `meshtrain train` on a mesh give what `meshtrain eval
// CKPT --task` gives for the same checkpoint in one process (the same
// accuracy, acc_norm and answer log-likelihood), on tp 2 with SP x dp 2 and on
// pp 2 x cp 2; a bad task is one error before any rank starts. Mixtures: a run
// on data.sources stopped and resumed mid-way equals the straight run bitwise,
// and logs each source's share, tokens, epochs and validation loss, which
// `meshtrain eval CKPT --data` reproduces.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

using test::Dir;

struct Scores {
  std::string acc, acc_norm;
  double answer_ll = 0;
  int questions = 0;
};

// The last "task NAME: acc A | acc_norm B | answer log-likelihood L (N questions)" in `out`.
Scores scores_of(const std::string& out, const std::string& name) {
  const std::regex line("task " + name +
                        ": acc ([0-9.]+) \\| acc_norm ([0-9.]+) \\| answer log-likelihood (-?[0-9.]+) \\(([0-9]+) questions\\)");
  Scores s;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    s = {(*it)[1], (*it)[2], std::stod((*it)[3]), std::stoi((*it)[4])};
  }
  return s;
}

// 10 questions of 3 choices (30 rows: not a multiple of micro_batch x dp, so the last forwards are padded).
std::string write_task(const Dir& d, const std::string& name) {
  std::ofstream f(d.path / name);
  for (int i = 0; i < 10; ++i) {
    const int n = i % 17;
    f << "{\"context\": \"In the beginning God created the heaven and the earth\", \"choices\": [\" " << n << "\", \" "
      << (n + 5) % 17 << "\", \" God created\"], \"answer\": " << i % 3 << "}\n";
  }
  return (d.path / name).string();
}

TEST(EvalCli, TaskScoresDuringTrainingEqualEvalOfTheCheckpoint) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  test::tiny_tokenizer(d, bin);  // d/tok: tokenizer.model, train.bin, val.bin
  const std::string task = write_task(d, "verses.jsonl");
  for (const std::string mesh : {"tp = 2\nsp = true\n", "pp = 2\ncp = 2\n"}) {
    SCOPED_TRACE(mesh);
    const std::string ckpt = (d.path / "ckpt").string();
    std::filesystem::remove_all(ckpt);
    const std::string cfg = d.write(
        "t.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 512\ndropout = 0.0\n[data]\ntrain = \"" +
                      (d.path / "tok/train.bin").string() +
                      "\"\n[train]\nsteps = 3\nmicro_batch = 2\nglobal_batch = 4\nseq = 32\nlr = 1e-2\n"
                      "eval_every = 2\npeak_tflops = 1000\n[eval]\ntasks = [\"" + task +
                      "\"]\n[checkpoint]\ndir = \"" + ckpt + "\"\n[parallel]\nnproc = 4\n" + mesh);
    const auto run = test::run_command(bin + " train " + cfg);
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("step     2 | task verses: acc"), std::string::npos) << run.output;  // every eval_every
    const Scores trained = scores_of(run.output, "verses");  // the last step's
    ASSERT_EQ(trained.questions, 10) << run.output;
    const auto eval = test::run_command(bin + " eval " + ckpt + " --task " + task);
    ASSERT_EQ(eval.code, 0) << eval.output;
    const Scores alone = scores_of(eval.output, "verses");
    ASSERT_EQ(alone.questions, 10) << eval.output;
    EXPECT_EQ(trained.acc, alone.acc);
    EXPECT_EQ(trained.acc_norm, alone.acc_norm);
    // fp32 on other meshes and another batching: rounding only.
    EXPECT_NEAR(trained.answer_ll, alone.answer_ll, 1e-5 * std::abs(alone.answer_ll));
    EXPECT_LT(alone.answer_ll, 0);
  }
}

TEST(EvalCli, BadTasksAreOneErrorBeforeAnyRankStarts) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = test::tiny_config(d, "s.toml", "") + " --nproc 2";
  d.write("tokenizer.model", "");  // beside the data: found, though never loaded (the checks fail first)
  const std::string bad = d.write("bad.jsonl", "{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"answer\": 0}\n"
                                               "{\"context\": \"a\", \"choices\": [\" b\", \" c\"], \"answer\": 2}\n");
  const std::string good = write_task(d, "good.jsonl");
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {" --set eval.tasks='[\"" + bad + "\"]'", bad + ":2: answer 2 is out of range: 2 choices, so 0..1"},
           {" --set eval.tasks='[\"" + good + "\"]' --set train.method='\"dpo\"'", "train.method \"dpo\" has another"},
           {" --set eval.tasks='[\"" + good + "\"]' --set eval.tokenizer='\"/no/tok.model\"'",
            "tokenizer /no/tok.model does not exist"}}) {
    const auto run = test::run_command(bin + " train " + cfg + set);
    EXPECT_EQ(run.code, 1) << set << "\n" << run.output;
    EXPECT_NE(run.output.find(want), std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << set << ": ranks were started\n" << run.output;
  }
}

// Two sources on 2 ranks (dp 2), weights 3 : 1, each with its validation shard; the small one
// (b) runs through several epochs in 6 steps.
TEST(MixtureCli, ResumeIsBitwiseAndEachSourceIsLogged) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  auto shard = [&](const std::string& name, uint32_t n, uint32_t mul) {
    std::vector<uint32_t> tokens(n);
    for (uint32_t i = 0; i < n; ++i) tokens[i] = (i * mul + i / 11) % 50;
    write_shard((d.path / name).string(), tokens, {0}, 2);
    return (d.path / name).string();
  };
  const std::string sources = "sources = [\n  {name = \"a\", path = \"" + shard("a.bin", 6000, 7) + "\", weight = 3, val = \"" +
                              shard("a_val.bin", 641, 7) + "\"},\n  {name = \"b\", path = \"" + shard("b.bin", 300, 3) +
                              "\", weight = 1, val = \"" + shard("b_val.bin", 641, 3) + "\"},\n]\n";
  const std::string ck = (d.path / "ck").string();
  auto config = [&](const std::string& name, const std::string& extra) {
    return d.write(name, "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.1\n[data]\n" + sources +
                             "[train]\nsteps = 6\nmicro_batch = 2\nglobal_batch = 8\nseq = 32\nlr = 1e-2\nlog_every = 1\n"
                             "eval_every = 3\npeak_tflops = 1000\n[parallel]\nnproc = 2\n" + extra);
  };
  auto metrics = [&](const std::string& name) { return " --set train.metrics='\"" + (d.path / name).string() + "\"'"; };
  auto run = test::run_command(bin + " train " + config("ref.toml", "") + metrics("ref.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  // 48 windows in 6 steps at 3 : 1: a has 36, b 12 (of its 9 windows: 1.333 epochs).
  EXPECT_NE(run.output.find("step     6 | sources | a 75.0% of windows, 1152 tokens, 0.193 epochs | b 25.0% of windows, "
                            "384 tokens, 1.333 epochs"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("step     3 | validation loss by source | a "), std::string::npos) << run.output;
  std::ifstream f(d.path / "ref.metrics");
  std::string line;
  for (int i = 0; i < 6; ++i) std::getline(f, line);
  const auto j = nlohmann::json::parse(line);  // step 6
  EXPECT_EQ(j["source_tokens"]["b"].get<int64_t>(), 384) << line;
  EXPECT_NEAR(j["source_epochs"]["b"].get<double>(), 12.0 / 9.0, 1e-12) << line;
  EXPECT_GT(j["val_loss_a"].get<double>(), 0) << line;
  EXPECT_GT(j["val_loss_b"].get<double>(), 0) << line;

  const std::string split = config("split.toml", "[checkpoint]\ndir = \"" + ck + "\"\n");
  run = test::run_command(bin + " train " + split + metrics("split.metrics") + " --set train.stop_after=3");
  ASSERT_EQ(run.code, 0) << run.output;
  run = test::run_command(bin + " train " + split + metrics("split.metrics"));
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed from " + ck + "/step_00000003"), std::string::npos) << run.output;
  const auto a = test::losses((d.path / "ref.metrics").string()), b = test::losses((d.path / "split.metrics").string());
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // bitwise: the printed doubles, dropout on
  // meshtrain eval --data on the final checkpoint: each source's validation loss as training logged it
  // (its 20 windows of 33 tokens, all of them: train.eval_windows = 0).
  run = test::run_command(bin + " eval " + ck + " --data " + (d.path / "a_val.bin").string() + " --data " +
                          (d.path / "b_val.bin").string());
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream g(d.path / "split.metrics");
  nlohmann::json last;
  for (std::string l; std::getline(g, l);) last = nlohmann::json::parse(l);
  for (const std::string src : {"a", "b"}) {
    const size_t at = run.output.find(src + "_val.bin: loss ");
    ASSERT_NE(at, std::string::npos) << run.output;
    EXPECT_NEAR(std::stod(run.output.substr(at + 15)), last["val_loss_" + src].get<double>(), 1e-4) << run.output;
  }
  EXPECT_NE(run.output.find("(20 windows of 32 tokens)"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace meshtrain
