// `meshtrain train` as a user runs it: config errors and --print-config, a
// short real run on 2 ranks that writes the metrics file, document masks,
// [init] from, --check-plan (checkpoints: test_ckpt_cli.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <future>
#include <iterator>
#include <map>
#include <tuple>
#include <fstream>
#include <sstream>

#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/pipeline_prediction.h"
#include "meshtrain/train/progress.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using test::Dir;
using test::error_of;
using test::expect_same_losses;
using test::losses;
using test::tiny_config;

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
  EXPECT_NE(error_of(d.write("j.toml", base), {"parallel.zero=4"}).find("parallel.zero = 4 must be 0..3 (0 DDP, 1 optimizer states sharded"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("k.toml", base), {"parallel.dp_shard=2"}).find("needs parallel.zero >= 1"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("l.toml", base), {"parallel.offload=true"}).find("set parallel.zero = 1 or 2, or remove parallel.offload"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("m.toml", base), {"parallel.pp=2", "parallel.zero=2"})
                .find("parallel.zero = 2 with parallel.pp = 2"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("n.toml", base), {"parallel.schedule=zigzag"}).find("parallel.schedule"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("o.toml", base), {"model.attention=flash"}).find("model.attention = \"flash\": use"),
            std::string::npos);
  EXPECT_EQ(error_of(d.write("p.toml", base), {"model.attention=tiled", "model.dropout=0.1"}), "");  // tiled drops too
  EXPECT_NE(error_of(d.write("q.toml", base), {"train.document_mask=true", "model.attention=naive"})
                .find("train.document_mask needs model.attention = \"tiled\" or \"auto\" (it is \"naive\")"),
            std::string::npos);
  EXPECT_EQ(error_of(d.write("q2.toml", base), {"train.document_mask=true"}), "");  // auto, the default, masks
  TrainConfig c = load_train_config(d.write("h.toml", base), {"train.lr=0.5", "model.layers=3", "train.schedule=linear"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.optim.schedule, LrSchedule::Linear);
}

// Non-finite numbers and values out of range are one error naming the key, the
// value and the allowed range (lr = nan used to train to NaN and save it).
TEST(TrainConfig, NonFiniteAndOutOfRangeValuesAreNamed) {
  Dir d;
  const std::string cfg = d.write("r.toml", "[data]\ntrain = \"x.bin\"\n");
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {"train.lr=nan", "train.lr = nan must be a finite number"},
           {"train.clip=inf", "train.clip = inf must be a finite number"},
           {"train.lr=0", "train.lr = 0 must be > 0"},
           {"train.warmup=-5", "train.warmup = -5 must be at least 0"},
           {"train.clip=-1", "train.clip = -1 must be >= 0"},
           {"train.min_lr_ratio=1.5", "train.min_lr_ratio = 1.5 must be in [0, 1]"},
           {"model.dropout=1.0", "model.dropout = 1 must be in [0, 1)"},
           {"parallel.nproc=0", "parallel.nproc = 0 must be at least 1"},
           {"checkpoint.timeout=-1", "checkpoint.timeout = -1 must be > 0"},
           // Found by the fuzzer (issue #43): a value that is more than one TOML value, a quote in a
           // bare word (was a raw parser error), a layer count that took 90 s to refuse.
           {"train.lr=1e-4\ntrain.steps=3", "holds more than one TOML value (a newline?)"},
           {"train.schedule=li\"near", "li\"near"},
           {"model.layers=4294967296", "layers = 4294967296 is more than 100000"}}) {
    EXPECT_NE(error_of(cfg, {set}).find(want), std::string::npos) << set << ": " << error_of(cfg, {set});
  }
  EXPECT_EQ(error_of(cfg, {"train.clip=0", "train.warmup=0"}), "");  // 0: no clipping, no warmup
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --nproc -1");
  EXPECT_NE(run.code, 0);
  EXPECT_NE(run.output.find("--nproc -1 must be at least 1"), std::string::npos) << run.output;
}

// A shard holding token ids the model's vocabulary lacks (a val shard of
// another tokenizer) is one error before training, on one rank and on two.
TEST(TrainCli, TokenIdsBeyondTheVocabularyAreOneErrorBeforeStart) {
  Dir d;
  std::vector<uint32_t> tokens(2000, 5);
  tokens[1234] = 70;  // vocab is 64
  write_shard((d.path / "val.bin").string(), tokens, {0}, 2);
  const std::string cfg = tiny_config(d, "v.toml", "") + " --set data.val='[\"" + (d.path / "val.bin").string() + "\"]'";
  for (const char* nproc : {" --nproc 1", " --nproc 2"}) {
    const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + nproc);
    EXPECT_EQ(run.code, 1) << run.output;
    EXPECT_NE(run.output.find("model.vocab 64 is smaller than token id 70 in " + (d.path / "val.bin").string()),
              std::string::npos)
        << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "ranks were started\n" << run.output;
  }
}

// One schema (issue #47): a key set away from its default that the run does not read (a pipeline
// schedule without a pipeline, DDP's buckets under ZeRO, checkpoint.keep without checkpoint.dir, ...)
// is one error naming the key, why the run does not read it and what would; at its default, or in a
// run that reads it, it loads. From the file and from --set alike.
TEST(TrainConfig, AKeyTheRunDoesNotReadIsOneError) {
  Dir d;
  const std::string cfg = test::tiny_config(d, "u.toml", "");
  const std::vector<std::pair<std::vector<std::string>, std::string>> unread{
      {{"parallel.schedule=\"gpipe\""},
       "parallel.schedule = \"gpipe\" is set (--set), and this run does not read it: parallel.pp = 1: the run has no "
       "pipeline (set parallel.pp); or remove parallel.schedule"},
      {{"parallel.virtual=2"}, "parallel.virtual = 2 is set (--set), and this run does not read it: parallel.pp = 1"},
      {{"parallel.cp_impl=\"ulysses\""}, "parallel.cp = 1: the run has no context parallelism"},
      {{"parallel.zero=1", "ddp.bucket_mb=50"},
       "ddp.bucket_mb = 50 is set (--set), and this run does not read it: parallel.zero = 1: ZeRO reduces the gradients "
       "itself"},
      {{"parallel.zero=2", "ddp.overlap=false"}, "ddp.overlap = false is set (--set)"},
      {{"train.fp8_history=4"}, "train.precision = \"fp32\": no FP8 linears"},
      {{"checkpoint.keep=3"}, "checkpoint.dir = \"\": the run saves no checkpoint"},
      {{"spike.policy=\"log\"", "spike.max_rollbacks=5"}, "spike.policy = \"log\": only \"rollback\""},
      {{"spike.policy=\"off\"", "spike.window=90"}, "spike.policy = \"off\": nothing is detected"},
      {{"lora.alpha=32"}, "lora.rank = 0: the run trains no LoRA adapters"},
      {{"eval.tokenizer=\"t.model\""}, "eval.tasks = []: no task is scored"},
  };
  for (const auto& [sets, want] : unread) {
    EXPECT_NE(test::error_of(cfg, sets).find(want), std::string::npos) << sets.back() << ": " << test::error_of(cfg, sets);
  }
  // Read by the run, or at the default: loads.
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"parallel.pp=2", "parallel.schedule=\"gpipe\"", "parallel.nproc=4"},
        {"parallel.schedule=\"1f1b\""}, {"ddp.bucket_mb=50"}, {"parallel.zero=1", "ddp.bucket_mb=25"},
        {"checkpoint.dir=\"c\"", "checkpoint.keep=3"}, {"lora.rank=4", "lora.alpha=32"},
        {"spike.policy=\"rollback\"", "checkpoint.dir=\"c\"", "checkpoint.every=2", "spike.max_rollbacks=5"}}) {
    EXPECT_EQ(test::error_of(cfg, sets), "") << sets.back();
  }
  // In the file as with --set; a file's key is judged by the file, so a --set that switches its feature
  // off (checkpoint.dir = "", parallel.pp = 1) takes the file's settings of it along.
  const std::string head = "[model]\npreset = \"gpt-tiny\"\n[data]\ntrain = \"" + (d.path / "train.bin").string() + "\"\n";
  const std::string file = d.write("u2.toml", head + "[checkpoint]\nevery = 5\n");
  EXPECT_NE(test::error_of(file).find("checkpoint.every = 5 is set, and this run does not read it"), std::string::npos)
      << test::error_of(file);
  const std::string saving = d.write("u3.toml", head + "[checkpoint]\ndir = \"c\"\nevery = 5\n"
                                                       "[parallel]\npp = 2\nschedule = \"gpipe\"\n");
  EXPECT_EQ(test::error_of(saving), "");
  EXPECT_EQ(test::error_of(saving, {"checkpoint.dir=\"\"", "parallel.pp=1"}), "");
  EXPECT_NE(test::error_of(saving, {"parallel.pp=1", "parallel.schedule=\"zb-h1\""}).find("parallel.schedule = "
                                                                                         "\"zb-h1\" is set (--set)"),
            std::string::npos);
}

// --print-config prints every key of the table with its type, range and help,
// as TOML that loads back to the same config.
TEST(TrainConfig, PrintConfigIsTheWholeConfigAndLoadsBack) {
  Dir d;
  const std::string cfg = d.write("pc.toml", "[model]\npreset = \"llama-tiny\"\nlayers = 3\n[data]\ntrain = [\"a.bin\", \"b.bin\"]\n"
                                             "[train]\nlr = 2.5e-4\nmetrics = \"m \\\"q\\\".jsonl\"\n");
  // A method's own section ([dpo]) with a key set: printed with the method (test_toy_method.cpp: left out for others).
  const TrainConfig c = load_train_config(cfg, {"parallel.zero=2", "train.method=\"dpo\"", "dpo.loss=\"ipo\""});
  const std::string printed = print_config(c);
  for (const char* want : {"preset = \"llama-tiny\"", "layers = 3", "lr = 0.00025", "zero = 2", "loss = \"ipo\"",
                           "train = [\"a.bin\", \"b.bin\"]", "# integer, 0..3: 0 DDP", "# number, > 0: peak learning rate",
                           "[checkpoint]"}) {
    EXPECT_NE(printed.find(want), std::string::npos) << want << "\n" << printed;
  }
  const std::string again = print_config(load_train_config(d.write("pc2.toml", printed), {}));
  EXPECT_EQ(again, printed);
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --print-config");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("layers = 3"), std::string::npos) << run.output;
}

// Errors the config, the data or the paths already show are one message from
// the launching process: no rank starts (no "[rank N]" line), exit status 1.
// A second job on a checkpoint directory in use is one of them.
TEST(TrainCli, ConfigOnlyErrorsComeBeforeAnyRankStarts) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "s.toml", "") + " --nproc 2";
  std::ofstream(d.path / "not_a_dir") << "a file where the checkpoint directory should be";
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {" --set train.precision='\"fp16\"' --set parallel.pp=2", "the pipeline schedules have no loss scaler"},
           {" --set train.global_batch=6", "train.global_batch 6 is not divisible by micro_batch 2 x dp 2"},
           {" --set checkpoint.dir='\"" + (d.path / "not_a_dir/ck").string() + "\"'", "cannot be created"}}) {
    const auto run = test::run_command(bin + " train " + cfg + set);
    EXPECT_EQ(run.code, 1) << set << "\n" << run.output;
    EXPECT_NE(run.output.find(want), std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << set << ": ranks were started\n" << run.output;
  }
  // What each rank used to find after it started (the error printed once per rank, the
  // checkpoint directory already locked): one message from the launching process, and the
  // checkpoint directory untouched.
  const std::string fresh = (d.path / "fresh").string();
  const std::string in_fresh = " --set checkpoint.dir='\"" + fresh + "\"'";
  for (const auto& [pre, set, want] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"", " --set checkpoint.resume='\"" + (d.path / "nowhere").string() + "\"'", "checkpoint.resume = \""},
           {"MESHTRAIN_SHM=2 ", "", "MESHTRAIN_SHM='2': use 1"},
           {"MESHTRAIN_SHM_CMA=yes ", "", "MESHTRAIN_SHM_CMA='yes': use 1"},
           {"", " --set train.metrics='\"" + (d.path / "not_a_dir/m.jsonl").string() + "\"'", "is not a writable directory"}}) {
    const auto run = test::run_command(pre + bin + " train " + cfg + in_fresh + set);
    EXPECT_EQ(run.code, 1) << set << "\n" << run.output;
    EXPECT_NE(run.output.find(want), std::string::npos) << pre << set << "\n" << run.output;
    EXPECT_EQ(run.output.find(want), run.output.rfind(want)) << "printed more than once\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << set << ": ranks were started\n" << run.output;
    EXPECT_FALSE(std::filesystem::exists(fresh + "/.lock")) << pre << set << ": a lock was left\n" << run.output;
  }
  // Job A holds the directory (a long run); job B on it is refused before its ranks start; A finishes.
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "shared").string() + "\"'";
  auto a = std::async(std::launch::async, [&] { return test::run_command(bin + " train " + cfg + ck + " --set train.steps=300"); });
  auto holder = [&] {  // what A's rank 0 wrote into the lock it holds ("pid N on HOST")
    std::ifstream f(d.path / "shared" / ".lock");
    std::string line;
    std::getline(f, line);
    return line;
  };
  for (int i = 0; i < 1200 && holder().empty(); ++i) {
    if (a.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
  }
  ASSERT_FALSE(holder().empty()) << "job A never took the lock";
  const auto b = test::run_command(bin + " train " + cfg + ck);
  EXPECT_EQ(b.code, 1) << b.output;
  EXPECT_NE(b.output.find("is in use by another running job (pid "), std::string::npos) << b.output;
  EXPECT_EQ(b.output.find("[rank"), std::string::npos) << b.output;
  const auto ra = a.get();
  EXPECT_EQ(ra.code, 0) << ra.output;
  EXPECT_NE(ra.output.find("step   300 | checkpoint"), std::string::npos) << ra.output;
}

// Past the first epoch (187 windows of 33 tokens: 23 global batches of 8, then epoch 1):
// one process with 4 micro-batches per step, and 2 data ranks with 2 each, train the same
// run, loss and gradient norm, every step. (The epoch used to end after floor(187 / (2 x dp))
// micro-batches, mid-step on one process: parity broke at step 24.) A run stopped in
// epoch 1 on 2 ranks resumes on one process exactly.
TEST(TrainCli, ParityHoldsAcrossAnEpochBoundary) {
  Dir d;
  const std::string cfg = tiny_config(d, "e.toml", "") + " --set model.dropout=0.0 --set train.steps=28";
  const auto run = [&](const std::string& nproc, const std::string& tag) {
    const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + nproc + " --set train.metrics='\"" +
                                     (d.path / tag).string() + "\"'");
    EXPECT_EQ(r.code, 0) << r.output;
    return (d.path / tag).string();
  };
  const std::string one = run(" --nproc 1", "one");
  test::expect_same_losses(one, run(" --nproc 2", "dp2"), 0, 28);
  // Stopped in epoch 1 on 2 ranks, resumed on one process: the steps that follow are the straight run's.
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"'";
  run(" --nproc 2 --set train.stop_after=25" + ck, "dp2_part");
  test::expect_same_losses(one, run(" --nproc 1" + ck, "resumed"), 25, 3);
}

// parallel.pp_layers and pp_balance: each bad value is one error naming it before a rank starts;
// the cut the engine builds is the config's, and a pipeline cut unevenly (3 + 1 of 4 layers) trains
// as one process does (loss and gradient norm within 1e-5, 26 steps: past the epoch's 23 global
// batches; at the parity matrix's lr 1e-3: at tiny_config's 1e-2 Adam grows pp's reduction-order
// rounding to 4.2e-5 in the gradient norm, measured the same for the even cut and this one). Interleaved chunks keep the parameter balance (refused otherwise). A vocabulary-heavy model
// balanced by compute moves layers off the head's stage; by parameters it stays even.
TEST(TrainCli, PipelineStagesAreCutWhereTheConfigSays) {
  Dir d;
  const std::string base = "[data]\ntrain = \"x.bin\"\n[model]\nlayers = 4\n";
  EXPECT_NE(error_of(d.write("a.toml", base), {"parallel.pp_layers=[3, 1]"}).find("needs parallel.pp > 1"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("b.toml", base), {"parallel.pp=2", "parallel.pp_layers=[3, 3]"})
                .find("parallel.pp_layers = [3, 3]: layers per stage [3, 3] must be >= 1 each and add up to the "
                      "model's 4 layers (they add up to 6)"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("c.toml", base), {"parallel.pp=2", "parallel.pp_layers=[4]"})
                .find("lists 1 stages, the pipeline has 2"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("e.toml", base), {"parallel.pp=2", "parallel.pp_layers=[0, 4]"})
                .find("parallel.pp_layers = 0 must be each at least 1"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("f.toml", base), {"parallel.pp_layers=3"}).find("must be a list of integers"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("v.toml", base), {"parallel.pp=2", "parallel.virtual=2", "parallel.schedule=\"interleaved\"",
                                              "parallel.pp_balance=\"compute\""})
                .find("not with parallel.virtual = 2"),
            std::string::npos);
  EXPECT_NE(error_of(d.write("g.toml", base), {"parallel.pp_balance=\"flops\""})
                .find("parallel.pp_balance = \"flops\": 'flops' is not a stage balance"),
            std::string::npos);
  TrainConfig c = load_train_config(d.write("h.toml", base), {"parallel.pp=2", "parallel.pp_layers=[3, 1]"});
  EXPECT_EQ(stage_layer_counts(c), (std::vector<int64_t>{3, 1}));
  c = load_train_config(d.write("i.toml", base), {"model.vocab=50000", "model.tied=false", "parallel.pp=2"});
  EXPECT_EQ(stage_layer_counts(c), (std::vector<int64_t>{2, 2}));
  c = load_train_config(d.write("j.toml", base),
                        {"model.vocab=50000", "model.tied=false", "parallel.pp=2", "parallel.pp_balance=\"compute\""});
  EXPECT_EQ(stage_layer_counts(c), (std::vector<int64_t>{3, 1}));
  // The log's prediction counts the stages' work. gpt-tiny (h 128) with an untied 3072 x 128 head, two
  // layers' worth: by parameters [2, 2] (the embedding balances the head), whose last stage has twice
  // the first's work, so rank 0 idles 60% of a 1F1B step of 2 micro-batches (schedule tests: equal
  // stages 33%); the note names the compute-balanced cut, [3, 1], whose stages are equal.
  EXPECT_TRUE(compute_balance_note(c, 2, predict_pipeline(c, 2)).empty());  // already balanced by compute
  c = load_train_config(d.write("k.toml", base), {"model.vocab=3072", "model.tied=false", "parallel.pp=2"});
  const PipelinePrediction even = predict_pipeline(c, 2);
  EXPECT_EQ(even.layers, (std::vector<int64_t>{2, 2}));
  EXPECT_NEAR(even.work[0], 0.5, 0.01);
  EXPECT_DOUBLE_EQ(even.work[1], 1.0);
  EXPECT_NEAR(even.bubble, 0.6, 0.01);
  const std::string note = compute_balance_note(c, 2, even);
  EXPECT_NE(note.find("parallel.pp_balance = \"compute\" cuts [3, 1]"), std::string::npos) << note;
  c.pp_layers = {2, 2};
  EXPECT_TRUE(compute_balance_note(c, 2, predict_pipeline(c, 2)).empty());  // the user chose the layers

  const std::string cfg =
      tiny_config(d, "p.toml", "") + " --set model.layers=4 --set model.dropout=0.0 --set train.steps=26 --set train.lr=1e-3";
  const auto run = [&](const std::string& mesh, const std::string& tag) {
    const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + mesh + " --set train.metrics='\"" +
                                     (d.path / tag).string() + "\"'");
    EXPECT_EQ(r.code, 0) << r.output;
    return std::make_pair((d.path / tag).string(), r.output);
  };
  const auto one = run(" --nproc 1", "one");
  const auto cut = run(" --set parallel.pp=2 --set 'parallel.pp_layers=[3, 1]'", "pp_3_1");
  EXPECT_NE(cut.second.find("layers per stage [3, 1] (parallel.pp_layers)"), std::string::npos) << cut.second;
  test::expect_same_losses(one.first, cut.first, 0, 26);
}

TEST(TrainConfig, ProgressShowsElapsedAndTheTimeLeft) {
  EXPECT_EQ(duration_text(44.6), "45s");
  EXPECT_EQ(duration_text(184), "3m04s");
  EXPECT_EQ(duration_text(7500), "2h05m");
  EXPECT_EQ(duration_text(3 * 86400 + 4 * 3600 + 59), "3d04h");
  // 10 steps in 20 s, at step 110 of 1000 (resumed at 100): 890 steps of 2 s left.
  EXPECT_EQ(progress_text(20, 10, 110, 1000), "elapsed 20s | eta 29m40s");
  EXPECT_EQ(progress_text(20, 10, 1000, 1000), "elapsed 20s | eta 0s");
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
                                                "\"\npeak_tflops = 1000\n[parallel]\ntp = 2\nsp = true\nnproc = 2\n");
  // This host's copy bandwidth, which the planned exposed communication needs, measured and cached by the
  // planner (a cache of this test's own).
  const std::string cache = "MESHTRAIN_CACHE='" + d.path.string() + "' ";
  const auto plan = test::run_command(cache + MESHTRAIN_BIN + " plan --gpu cpu --model gpt-tiny --gpus 2 --top 1");
  ASSERT_EQ(plan.code, 0) << plan.output;
  const auto run = test::run_command(cache + MESHTRAIN_BIN + " train " + cfg);
  const std::string& out = run.output;
  ASSERT_EQ(run.code, 0) << out;
  EXPECT_NE(out.find("validation loss"), std::string::npos) << out;
  // The MFU divides by the given peak (1000 TFLOP/s on one host), not by a measured or typed-in one.
  const size_t mfu_at = out.find("MFU = ");
  ASSERT_NE(mfu_at, std::string::npos) << out;
  EXPECT_NE(out.find("/ (1 host(s) x 1e+06 GFLOP/s: train.peak_tflops)", mfu_at), std::string::npos) << out;
  const double flops_per_token = std::stod(out.substr(mfu_at + 6));
  EXPECT_NE(out.find("| elapsed "), std::string::npos) << out;  // progress on every step line
  EXPECT_NE(out.find(" | eta 0s\n"), std::string::npos) << out;    // at the last step
  std::ifstream f(metrics);
  std::string line;
  int lines = 0;
  while (std::getline(f, line)) {
    ++lines;
    for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"", "\"mfu\"",
                            "\"peak_mem_bytes\"", "\"elapsed_s\""}) {
      EXPECT_NE(line.find(key), std::string::npos) << key << " in " << line;
    }
    const auto j = nlohmann::json::parse(line);
    EXPECT_NEAR(j["mfu"].get<double>() / (flops_per_token * j["tokens_per_s"].get<double>() / 1e15), 1.0, 1e-3) << line;
    // tp 2 with SP: its all-gathers and reduce-scatters sit between the forward's and the backward's
    // products and cannot hide. Exposed: more than nothing, less than the step (train/exposed_comm.h).
    const double step_s = 8 * 32 / j["tokens_per_s"].get<double>();
    ASSERT_TRUE(j.contains("exposed_comm_s") && j["exposed_comm_s"].contains("tp")) << line;
    EXPECT_GT(j["exposed_comm_s"]["tp"].get<double>(), 0) << line;
    EXPECT_LT(j["exposed_comm_s"]["tp"].get<double>(), step_s) << line;
    // Beside it, the planner's estimate on this host (exposed_comm.h: plan::cpu_device).
    ASSERT_TRUE(j.contains("planned_exposed_comm_s") && j["planned_exposed_comm_s"].contains("tp")) << line;
    EXPECT_GT(j["planned_exposed_comm_s"]["tp"].get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_NE(out.find("| exposed communication: "), std::string::npos) << out;
  EXPECT_NE(out.find("%; plan "), std::string::npos) << out;
}

// The MFU's denominator is this host's GEMM rate, measured by the launching process on all
// cores before the 2 ranks started (the ranks compute nothing meanwhile), not a best-ever;
// losses() checks every step's MFU is within (0, 100 %].
TEST(TrainCli, MfuDividesByTheHostRateMeasuredBeforeTheRanksStart) {
  Dir d;
  const std::string metrics = (d.path / "m.metrics").string();
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --set train.metrics='\"" +
                                     metrics + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const size_t mfu_at = run.output.find("MFU = ");
  ASSERT_NE(mfu_at, std::string::npos) << run.output;
  const std::string line = run.output.substr(mfu_at, run.output.find('\n', mfu_at) - mfu_at);
  EXPECT_NE(line.find("(1 host(s) x "), std::string::npos) << line;
  EXPECT_NE(line.find("fp32 GEMMs on all " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) +
                      " cores before the ranks started"),
            std::string::npos)
      << line;
  EXPECT_FALSE(test::losses(metrics).empty());
}

// train.document_mask through `meshtrain train` (tp 2 with SP): a corpus of
// 7-token documents trains with its documents masked, and the first step's
// loss differs from the unmasked run's (the model-level equivalence is
// TiledAttention.PackedDocumentsEqualDocumentsAlone).
TEST(TrainCli, DocumentMaskTrainsOnPackedDocuments) {
  Dir d;
  std::vector<uint32_t> tokens(6000);
  std::vector<uint64_t> starts;
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
    if (i % 7 == 0) starts.push_back(i);
  }
  write_shard((d.path / "docs.bin").string(), tokens, starts, 2);
  const std::string cfg = d.write("d.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n"
                                            "attention = \"tiled\"\n[data]\ntrain = \"" + (d.path / "docs.bin").string() +
                                                "\"\n[train]\nsteps = 2\nmicro_batch = 2\nglobal_batch = 4\nseq = 32\n"
                                                "log_every = 1\n[parallel]\ntp = 2\nsp = true\nnproc = 2\n");
  std::map<int, std::string> loss[2];
  for (int masked = 0; masked < 2; ++masked) {
    const std::string m = (d.path / ("m" + std::to_string(masked))).string();
    const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --set train.metrics='\"" + m +
                                       "\"' --set train.document_mask=" + (masked ? "true" : "false"));
    ASSERT_EQ(run.code, 0) << run.output;
    loss[masked] = losses(m);
  }
  ASSERT_EQ(loss[0].size(), 2u);
  ASSERT_EQ(loss[1].size(), 2u);
  EXPECT_NE(loss[0].at(1), loss[1].at(1));
}

// [init] from: a new run starts from a checkpoint's weights (any mesh), with a
// new optimizer at step 0 and the data from its start: its first loss is the
// same on dp 2 and on tp 2 (1e-5 relative) and lower than a fresh model's; a
// checkpoint of another shape, or no checkpoint, is one error before ranks start.
TEST(TrainCli, InitFromStartsFromTheWeights) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "i.toml", "") + " --set model.dropout=0.0";
  const std::string ck = (d.path / "ck").string();
  auto run = test::run_command(bin + " train " + cfg + " --set checkpoint.dir='\"" + ck + "\"'");
  ASSERT_EQ(run.code, 0) << run.output;
  const std::string from = " --set init.from='\"" + ck + "\"' --set train.stop_after=1";
  std::map<std::string, double> first;
  for (const auto& [mesh, tag] : {std::pair<std::string, std::string>{"", "dp2"},
                                  {" --set parallel.tp=2 --set parallel.sp=true", "tp2"}, {" --set init.from='\"\"'", "fresh"}}) {
    const std::string m = (d.path / tag).string();
    run = test::run_command(bin + " train " + cfg + from + mesh + " --set train.metrics='\"" + m + "\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    if (tag != "fresh") {
      EXPECT_NE(run.output.find("weights from " + ck + "/step_00000006 (step 6"), std::string::npos) << run.output;
    }
    first[tag] = std::stod(losses(m).at(1));
  }
  EXPECT_NEAR(first["tp2"], first["dp2"], 1e-5 * first["dp2"]);
  EXPECT_LT(first["dp2"], first["fresh"] - 0.1);
  for (const auto& [set, message] : {std::pair<std::string, std::string>{" --set model.layers=3", "has model.layers = 2, the config asks for 3"},
                                     {" --set model.preset='\"llama-tiny\"' --set model.hidden=128 --set model.kv_heads=4 "
                                      "--set model.ffn=512",
                                      "has a model with norm \"layernorm\", the config's has \"rmsnorm\""},
                                     {" --set init.from='\"" + (d.path / "nothing").string() + "\"'", "init.from"}}) {
    run = test::run_command(bin + " train " + cfg + from + set);
    EXPECT_NE(run.code, 0) << set;
    EXPECT_NE(run.output.find(message), std::string::npos) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "a rank started: " << run.output;
  }
}

// --check-plan: after the first step the planner's per-rank bytes (model
// states, traffic per axis) are printed beside the runtime's and must agree
// within 5%: ZeRO-3 on dp 2, pp 2 with a tied embedding, tp 2 with SP; fp8's
// weight copies on one and on tp 2.
TEST(TrainCli, CheckPlanAgreesWithTheRuntime) {
  Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = tiny_config(d, "c.toml", "") + " --check-plan --set train.stop_after=1";
  for (const std::string mesh : {" --set parallel.zero=3", " --set parallel.pp=2 --set model.tied=true",
                                 " --set parallel.pp=2 --set model.layers=4 --set 'parallel.pp_layers=[3, 1]'",
                                 " --set parallel.tp=2 --set parallel.sp=true"}) {
    const auto run = test::run_command(bin + " train " + cfg + mesh);
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("check-plan, pipeline stage 0"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("dp bytes moved"), std::string::npos) << run.output;
  }
  // fp8: the model states and the e4m3 weight copies of the blocks' linears (plan/memory.h); bytes
  // moved are compared in fp32 runs only (autocast changes an activation's dtype op by op).
  for (const std::string mesh : {"", " --set parallel.tp=2 --set parallel.sp=true"}) {
    const auto run = test::run_command(bin + " train " + cfg + mesh + " --set train.precision='\"fp8\"'");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("fp8 weight copies"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("bytes moved: compared in fp32 runs only; this one is fp8"), std::string::npos)
        << run.output;
  }
}

}  // namespace
}  // namespace meshtrain
