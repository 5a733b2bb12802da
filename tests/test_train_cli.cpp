// `meshtrain train` as a user runs it: config errors, and a short real run on 2
// ranks that writes the metrics file.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "tests/run_command.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::temp_directory_path() / ("meshtrain_train_" + std::to_string(getpid()));
  Dir() { fs::create_directories(path); }
  ~Dir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

std::string error_of(const std::string& path, std::vector<std::string> sets = {}) {
  try {
    load_train_config(path, sets);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, UnknownKeysAndWrongTypesAreNamed) {
  Dir d;
  const std::string base = "[data]\ntrain = \"x.bin\"\n";
  EXPECT_NE(error_of(d.write("a.toml", base + "[train]\nstepz = 3\n")).find("unknown config key 'train.stepz'"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("b.toml", base + "[train]\nsteps = \"many\"\n")).find("train.steps must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("c.toml", base + "[optimizer]\nlr = 1\n")).find("unknown config key 'optimizer.lr'"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("d.toml", "[train]\nsteps = 3\n")).find("[data] train"), std::string::npos);
  EXPECT_NE(error_of(d.write("e.toml", base + "[model]\npreset = \"gpt9\"\n")).find("unknown model 'gpt9'"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("f.toml", base), {"train.lr"}).find("is not section.key=value"), std::string::npos);
  EXPECT_NE(error_of(d.write("g.toml", base + "[train\n")).find("g.toml"), std::string::npos);
  EXPECT_NE(error_of(d.write("i.toml", base + "[train]\neval_every = 0\n")).find("train.eval_every = 0 must be at least 1"),
            std::string::npos);
  TrainConfig c = load_train_config(d.write("h.toml", base), {"train.lr=0.5", "model.layers=3", "train.schedule=linear"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.optim.schedule, LrSchedule::Linear);
}

TEST(TrainCli, ShortRunOnTwoRanksWritesMetrics) {
  Dir d;
  std::vector<uint32_t> tokens(6000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
  write_shard((d.path / "train.bin").string(), tokens, {0}, 2);
  write_shard((d.path / "val.bin").string(), std::vector<uint32_t>(tokens.begin(), tokens.begin() + 2000), {0}, 2);
  const std::string metrics = (d.path / "log.metrics").string();
  const std::string cfg = d.write("t.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n"
                                            "[data]\ntrain = \"" + (d.path / "train.bin").string() + "\"\nval = \"" +
                                                (d.path / "val.bin").string() +
                                                "\"\n[train]\nsteps = 4\nmicro_batch = 2\nglobal_batch = 8\nseq = 32\n"
                                                "lr = 1e-2\nlog_every = 1\neval_every = 2\nmetrics = \"" + metrics +
                                                "\"\n[parallel]\ntp = 2\nsp = true\nnproc = 2\n");
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg);
  const std::string& out = run.output;
  ASSERT_EQ(run.code, 0) << out;
  EXPECT_NE(out.find("validation loss"), std::string::npos) << out;
  std::ifstream f(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"", "\"mfu\"",
                            "\"peak_mem_bytes\""}) {
      EXPECT_NE(line.find(key), std::string::npos) << key << " in " << line;
    }
  }
  EXPECT_EQ(lines, 4);
}

}  // namespace
}  // namespace meshtrain
