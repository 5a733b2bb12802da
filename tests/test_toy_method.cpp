// Methods as plug-ins (train/method.h): a method registered from a test file
// (tests/toy_method_main.cpp, nothing else edited) trains through the
// library's trainer, on dp 2 as on one process; the core's method table names
// what is registered.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "meshtrain/train/config.h"
#include "meshtrain/train/method.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

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

// The toy method's section, declared in its file: its key sets what the method reads (a quarter of
// each window trains from 0.75 on), is range-checked, and is one error under a method that does not
// read the section.
TEST(ToyMethod, ItsOwnSectionIsDeclaredWithIt) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "toy.toml", "") + " train.steps=2 second_half.from=0.75";
  const auto shares = test::metric(run_toy(d, cfg, 1, "second_half", "quarter"), "window_share");
  ASSERT_EQ(shares.size(), 2u);
  for (const auto& [step, share] : shares) EXPECT_DOUBLE_EQ(share, 0.25) << "step " << step;
  const auto toy = [&](const std::string& sets) {
    return test::run_command(std::string(MESHTRAIN_TOY_METHOD_BIN) + " " + cfg + " " + sets);
  };
  const auto pretrain = toy("'train.method=\"pretrain\"'");
  EXPECT_NE(pretrain.code, 0);
  EXPECT_NE(pretrain.output.find("second_half.from is given, and train.method = \"pretrain\" reads no [second_half] "
                                 "section (train.method \"second_half\" does)"),
            std::string::npos)
      << pretrain.output;
  const auto range = toy("'train.method=\"second_half\"' second_half.from=1");
  EXPECT_NE(range.output.find("second_half.from = 1 must be in [0, 1)"), std::string::npos) << range.output;
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
  // A method's own section names the methods that read it; a common section does not.
  for (const char* line : {"#   pretrain ", "#   grpo ", "method = \"pretrain\"", "lr = ",
                           "[rl]                             # read only by train.method \"grpo\", \"ppo\"\n",
                           "[dpo]                            # read only by train.method \"dpo\"\n", "\n[train]\n"}) {
    EXPECT_NE(help.find(line), std::string::npos) << line << " in:\n" << help;
  }
}

// One schema (issue #47): a section only some methods read ([dpo]; [rl] and [grpo] or [ppo]), given
// to a run whose method reads none of it, is one error naming the key and the methods that read it,
// from the file and from --set alike. --print-config leaves those sections out, so what it prints
// loads back; a config that holds them all at their defaults (checkpoints written before) loads once
// without_unread_sections drops them.
TEST(ToyMethod, ASectionItsMethodDoesNotReadIsOneError) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "s.toml", "");
  const std::string dpo = test::error_of(cfg, {"dpo.beta=0.2"});
  EXPECT_NE(dpo.find("dpo.beta is given, and train.method = \"pretrain\" reads no [dpo] section (train.method "
                     "\"dpo\" does)"),
            std::string::npos)
      << dpo;
  const std::string grpo = test::error_of(cfg, {"train.method=\"ppo\"", "grpo.loss=\"dapo\""});
  EXPECT_NE(grpo.find("grpo.loss is given, and train.method = \"ppo\" reads no [grpo] section"), std::string::npos)
      << grpo;
  const std::string rl = test::error_of(cfg, {"train.method=\"sft\"", "rl.group=4"});
  EXPECT_NE(rl.find("or set train.method to \"grpo\" or \"ppo\""), std::string::npos) << rl;
  const std::string file = d.write("dpo.toml", "[model]\npreset = \"gpt-tiny\"\n[data]\ntrain = \"" +
                                                   (d.path / "train.bin").string() + "\"\n[dpo]\nbeta = 0.3\n");
  EXPECT_NE(test::error_of(file).find("dpo.beta is given"), std::string::npos);
  EXPECT_EQ(test::error_of(file, {"train.method=\"dpo\""}), "") << "dpo reads [dpo]";
  // What --print-config writes loads back, for a method with sections and one without.
  for (const char* method : {"pretrain", "dpo"}) {
    const TrainConfig c = load_train_config(cfg, {std::string("train.method=\"") + method + "\""});
    const std::string printed = print_config(c);
    EXPECT_EQ(printed.find("[ppo]"), std::string::npos) << method;
    EXPECT_EQ(printed.find("[dpo]") != std::string::npos, std::string(method) == "dpo") << method;
    const std::string again = d.write(std::string(method) + ".printed.toml", printed);
    EXPECT_EQ(print_config(load_train_config(again, {})), printed) << method;
    // Every section, as manifests written before this check held them.
    const std::string every = print_config(c, true);
    EXPECT_NE(test::error_of(d.write("every.toml", every)), "") << method;
    EXPECT_EQ(print_config(load_train_config(d.write("dropped.toml", without_unread_sections(every)), {})), printed)
        << method;
  }
}

}  // namespace
}  // namespace meshtrain
