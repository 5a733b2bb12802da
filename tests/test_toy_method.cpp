// Methods as plug-ins (train/method.h): a method registered from a test file
// (tests/toy_method_main.cpp, nothing else edited) trains through the
// library's trainer, on dp 2 as on one process; the core's method table names
// what is registered.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "meshtrain/train/method.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"

namespace meshtrain {
namespace {

using test::Dir;

std::string run_toy(const Dir& d, const std::string& cfg, int nproc, const std::string& method, const std::string& tag) {
  const std::string metrics = (d.path / tag).string();
  const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " launch --nproc-per-node " + std::to_string(nproc) +
                                   " --master-port 0 " + MESHTRAIN_TOY_METHOD_BIN + " " + cfg +
                                   " parallel.nproc=" + std::to_string(nproc) + " 'train.method=\"" + method +
                                   "\"' 'train.metrics=\"" + metrics + "\"'");
  EXPECT_EQ(r.code, 0) << r.output;
  return metrics;
}

// The toy method's loss is its own (the second half of each window), and the
// same on dp 2 as on one process: losses and gradient norms within fp32
// rounding (relative 1e-5), its metric logged by the core. 26 steps cross the
// epoch (23 global batches of 8 windows in tiny_config's corpus).
TEST(ToyMethod, RegisteredInATestFileTrainsOnDp2AsOnOneProcess) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "toy.toml", "") + " train.steps=26";
  const std::string one = run_toy(d, cfg, 1, "second_half", "one"), two = run_toy(d, cfg, 2, "second_half", "two");
  test::expect_same_losses(one, two, 0, 26);
  const auto shares = test::metric(two, "window_share");
  ASSERT_EQ(shares.size(), 26u) << "the toy objective's metric, logged by the core";
  for (const auto& [step, share] : shares) EXPECT_DOUBLE_EQ(share, 0.5) << "step " << step;
  // Not pretraining under another name: the first step's loss is over other targets.
  const auto toy = test::metric(one, "loss"), pretrain = test::metric(run_toy(d, cfg, 1, "pretrain", "pre"), "loss");
  ASSERT_EQ(toy.count(1), 1u);
  ASSERT_EQ(pretrain.count(1), 1u);
  EXPECT_NE(toy.at(1), pretrain.at(1));
}

TEST(ToyMethod, TheTableNamesWhatIsRegistered) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "m.toml", "");
  EXPECT_NE(test::error_of(cfg, {"train.method=\"kto\""})
                .find("train.method = \"kto\": use one of \"pretrain\", \"sft\", \"dpo\", \"reward\", \"grpo\", \"ppo\""),
            std::string::npos);
  Method twice;
  twice.name = "dpo";
  EXPECT_THROW(register_method(twice), std::logic_error);
  EXPECT_THROW(method_named("kto"), std::invalid_argument);
  EXPECT_EQ(method_named("grpo").token_data, false);
  // meshtrain train --help-config: the methods with their lines, then every key at its default.
  const std::string help = help_config();
  for (const char* line : {"#   pretrain ", "#   grpo ", "method = \"pretrain\"", "[rl]", "lr = "}) {
    EXPECT_NE(help.find(line), std::string::npos) << line << " in:\n" << help;
  }
}

}  // namespace
}  // namespace meshtrain
