// The parity matrix (train/parity_matrix.h): the walk over every cell, and the
// generic runner that proves the cells it names.
//
// The walk (ParityMatrixWalk.EveryCellIsTestedOrRefused): every row has a cell
// per axis; a refused cell's config is refused by load_train_config or
// check_run (what `meshtrain train` runs before any rank starts) with its
// error; a tested cell's config is accepted and its test exists (in this
// binary, or in test_comm_mp's list); every row's one-process reference is
// accepted; every row runs in one of CTest's parity_matrix_* entries. The
// runner (ParityMatrix/Row.Cells/<row>): the reference, then each cell,
// through `meshtrain train` as a user runs it; per step the loss, the
// gradient norm and the row's own metrics within the row's tolerance, over 6
// steps that cross an epoch (37 windows, 4 global batches of 8 per epoch; the
// post-training rows' data: parity_matrix.cpp).
//
// Mutations, each made in src/ and seen to fail the runner (issue #41):
// the loss divided by 2 x tokens when dp > 1 (train/step.cpp) fails ddp x dp
// at step 1 (loss 4.156 vs 2.078); rank 1's loader slice shifted by one
// window (data/loader.cpp) fails ddp x dp at step 1 (loss 4.156 vs 4.149,
// gradient norm 3.11 vs 3.31); the experts' DDP skipped fails moe_ep x dp
// (loss 0.18, norm 0.96 off); rank 1's RL prompts shifted by one fails
// grpo x dp and ppo x dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/parity_matrix.h"
#include "meshtrain/train/trainer.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

using test::Dir;

// The matrix's run: 1200 tokens in documents of 60 (37 windows of 32), gpt-tiny with 2 layers, no dropout,
// lr 1e-3. Adam's first updates are about lr x sign(g) per element, so an element whose gradient is
// within its rounding error moves +lr on one mesh and -lr on another: the meshes' fp32 reorderings
// grow with lr. Measured on cp 2 against one process (Intel Xeon): at lr 1e-2 the gradient norm of
// step 4 parts by 1.4e-4, at lr 1e-3 by 1e-6 (loss 4e-8); the tolerance stays 1e-5.
std::string matrix_config(const Dir& d) {
  std::vector<uint32_t> tokens(1200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
  std::vector<uint64_t> docs;
  for (uint64_t s = 0; s < tokens.size(); s += 60) docs.push_back(s);
  write_shard((d.path / "matrix.bin").string(), tokens, docs, 2);
  return d.write("matrix.toml", "[model]\npreset = \"gpt-tiny\"\nlayers = 2\nvocab = 64\ndropout = 0.0\n[data]\ntrain = \"" +
                                    (d.path / "matrix.bin").string() +
                                    "\"\n[train]\nsteps = 6\nmicro_batch = 2\nglobal_batch = 8\nseq = 32\nlr = 1e-3\n"
                                    "log_every = 1\n");
}

// The files a row's sets name, made in `d` on first use: "{data}" the matrix's token shard, "{task}"
// `meshtrain tokenize task`'s directory (SFT conversations, preference pairs, RL prompts), "{base}" a
// checkpoint of the matrix's run (2 steps, one process); "{dir}" is each run's own scratch directory.
class MatrixFiles {
 public:
  explicit MatrixFiles(const Dir& d) : d_(d), config_(matrix_config(d)) {}
  const std::string& config() const { return config_; }

  std::vector<std::string> expand(std::vector<std::string> sets, const std::string& dir) {
    for (auto& s : sets) {
      for (const char* key : {"{dir}", "{data}", "{task}", "{base}"}) {
        for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at)) {
          const std::string value = std::string(key) == "{dir}" ? dir : path(key);
          s.replace(at, std::string(key).size(), value);
          at += value.size();
        }
      }
    }
    return sets;
  }

 private:
  std::string path(const std::string& key) {
    if (key == "{data}") return (d_.path / "matrix.bin").string();
    const std::string out = (d_.path / (key == "{task}" ? "task" : "base")).string();
    if (std::filesystem::exists(out)) return out;
    const std::string bin = MESHTRAIN_BIN;
    const auto run = test::run_command(key == "{task}" ? bin + " tokenize task --name arithmetic --seq 32 --count 40 --out " + out
                                                 : bin + " train " + config_ + " --set train.steps=2 --set "
                                                   "parallel.nproc=1 --set checkpoint.dir='\"" + out + "\"'");
    EXPECT_EQ(run.code, 0) << key << "\n" << run.output;
    return out;
  }

  const Dir& d_;
  std::string config_;
};

// `s` as one shell word (the reward command's awk program has single quotes).
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// step -> the metrics line of a step that trained (an RL run's file starts with a step-0 line).
std::map<int, nlohmann::json> trained_steps(const std::string& file) {
  std::map<int, nlohmann::json> out;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    const int step = j.at("step").get<int>();
    out[step] = std::move(j);
  }
  return out;
}

// Per step of a 6-step run: the loss within loss_tol x max(|loss|, loss_scale), the gradient norm within norm_tol
// relative (and not 0: a step without a gradient proves nothing), the row's other metrics within
// loss_tol x max(|v|, 1) (DPO's rewards and margins are differences of log-probabilities summed over a
// sequence, of size ~100, and 0 at the start by construction: their rounding follows the sums).
// `cell` holds the steps after `from` (a resumed run), `one` all 6.
void expect_close_metrics(const MatrixRow& row, const std::string& one, const std::string& cell, int from = 0) {
  const auto a = trained_steps(one), b = trained_steps(cell);
  ASSERT_EQ(a.size(), 6u) << one;
  ASSERT_EQ(b.size(), 6u - from) << cell;
  for (const auto& [step, x] : a) {
    if (step <= from) continue;
    ASSERT_TRUE(b.count(step)) << "step " << step << " in " << cell;
    const nlohmann::json& y = b.at(step);
    const auto near = [&](const std::string& key, double tol, double scale) {
      ASSERT_TRUE(x.contains(key) && y.contains(key)) << key << ", step " << step;
      const double u = x.at(key).get<double>(), v = y.at(key).get<double>();
      EXPECT_NEAR(u, v, tol * std::max(std::abs(u), scale)) << key << ", step " << step << " (" << cell << ")";
    };
    near("loss", row.loss_tol, row.loss_scale);
    EXPECT_GT(x.at("grad_norm").get<double>(), 0) << "step " << step << " of " << one << " has no gradient";
    near("grad_norm", row.norm_tol, 0);
    for (const auto& key : row.metrics) near(key, row.loss_tol, 1);
  }
}

// A checkpoint's trained weights by name: the model's (a PPO critic's too), whole whatever mesh saved them.
std::map<std::string, at::Tensor> saved_weights(const std::string& step_dir) {
  ckpt::Reader r(step_dir);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : r.manifest().at("tensors").items()) {
    if (name.rfind("model/", 0) == 0 || name.rfind("critic/model/", 0) == 0) out[name] = r.read_full(name).to(at::kDouble);
  }
  return out;
}

// The weights at the end (`one_end`, `cell_end`) within the row's weight_tol of the distance the
// reference travelled from its first checkpoint (`one_start`): ||w_cell - w_one|| <= tol x
// ||w_one - w_one_start||, L2 over every saved weight but the key bias (below). Vocabulary rows
// compare up to the shorter padding.
void expect_close_weights(const MatrixRow& row, const std::string& column, const std::string& one_start,
                          const std::string& one_end, const std::string& cell_end) {
  const double tol = row.weight_tol_on.count(column) ? row.weight_tol_on.at(column) : row.weight_tol;
  const auto start = saved_weights(one_start), a = saved_weights(one_end), b = saved_weights(cell_end);
  ASSERT_EQ(a.size(), b.size()) << one_end << " and " << cell_end << " hold other tensors";
  double apart = 0, travelled = 0, worst = 0;
  std::string worst_name;
  for (const auto& [name, x] : a) {
    ASSERT_TRUE(b.count(name)) << name << " is not in " << cell_end;
    // The key bias adds q.b to every score of a query's row, which softmax cancels: its gradient is
    // zero in exact arithmetic, and Adam steps it by about lr along its rounding noise, which differs
    // from mesh to mesh. Every other parameter is compared.
    if (name.size() >= 11 && name.compare(name.size() - 11, 11, "attn.k.bias") == 0) continue;
    const int64_t rows = std::min(x.size(0), b.at(name).size(0));
    const double diff = (x.narrow(0, 0, rows) - b.at(name).narrow(0, 0, rows)).norm().item<double>();
    apart += diff * diff;
    travelled += std::pow((x.narrow(0, 0, rows) - start.at(name).narrow(0, 0, rows)).norm().item<double>(), 2);
    if (diff > worst) worst = diff, worst_name = name;
  }
  EXPECT_GT(travelled, 0) << "the reference's weights did not move";
  const double ratio = std::sqrt(apart / travelled);
  std::printf("[weights] %s %s: %.3g of the distance travelled (largest difference %.3g in %s)\n", row.name.c_str(),
              cell_end.c_str(), ratio, worst, worst_name.c_str());
  EXPECT_LE(ratio, tol) << "the weights at the end of " << cell_end << " are " << ratio
                                   << " of the distance travelled apart from one process's (largest difference "
                                   << worst << " in " << worst_name << ")";
}

// The error load_train_config or check_run gives ("" when both accept).
std::string refusal(const std::string& cfg, const std::vector<std::string>& sets, int ranks) {
  try {
    const TrainConfig c = load_train_config(cfg, sets);
    check_run(c, ranks, ranks, false, false);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Every test's full name: this binary's, and test_comm_mp's (--gtest_list_tests).
std::set<std::string> known_tests() {
  std::set<std::string> out;
  const auto& unit = *testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const testing::TestSuite& s = *unit.GetTestSuite(i);
    for (int j = 0; j < s.total_test_count(); ++j) out.insert(std::string(s.name()) + "." + s.GetTestInfo(j)->name());
  }
  const auto list = test::run_command(std::string(MESHTRAIN_COMM_MP_BIN) + " --gtest_list_tests");
  EXPECT_EQ(list.code, 0) << list.output;
  std::istringstream in(list.output);
  std::string suite;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line[0] != ' ') {
      suite = line;
    } else {
      out.insert(suite + line.substr(line.find_first_not_of(' ')));
    }
  }
  return out;
}

// `name` matches gtest filter pattern `p` ('*': any run of characters; '?': one).
bool filter_match(const char* p, const char* name) {
  if (*p == '\0') return *name == '\0';
  if (*p == '*') return filter_match(p + 1, name) || (*name != '\0' && filter_match(p, name + 1));
  return *name != '\0' && (*p == '?' || *p == *name) && filter_match(p + 1, name + 1);
}

// The generic runner's tests that CTest runs: the --gtest_filter patterns of tests/CMakeLists.txt.
std::vector<std::string> ctest_patterns() {
  std::ifstream f(std::string(MESHTRAIN_SOURCE_DIR) + "/tests/CMakeLists.txt");
  EXPECT_TRUE(f.good());
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) {
    const size_t at = line.find("--gtest_filter=ParityMatrix/");
    if (at == std::string::npos) continue;
    std::istringstream patterns(line.substr(at + 15, line.find_first_of(" )", at) - at - 15));
    for (std::string p; std::getline(patterns, p, ':');) out.push_back(p);
  }
  return out;
}

TEST(ParityMatrixWalk, EveryCellIsTestedOrRefused) {
  Dir d;
  MatrixFiles files(d);
  const std::string& cfg = files.config();
  const std::set<std::string> tests = known_tests();
  const std::vector<std::string> ctest = ctest_patterns();
  const auto& axes = matrix_axes();
  std::set<std::string> names;
  for (const MatrixRow& row : parity_matrix()) {
    EXPECT_TRUE(names.insert(row.name).second) << "two rows named " << row.name;
    EXPECT_TRUE(std::any_of(ctest.begin(), ctest.end(),
                            [&](const std::string& p) { return filter_match(p.c_str(), generic_test(row).c_str()); }))
        << row.name << ": in no parity_matrix_* entry of tests/CMakeLists.txt, so CTest never runs its cells";
    ASSERT_EQ(row.cells.size(), axes.size()) << row.name;
    const std::string dir = (d.path / ("ck_" + row.name)).string();
    EXPECT_EQ(refusal(cfg, files.expand(reference_sets(row), dir), 1), "") << row.name << ": the reference";
    for (size_t i = 0; i < axes.size(); ++i) {
      const MatrixCell& cell = row.cells[i];
      const std::string where = row.name + " x " + axes[i].name;
      EXPECT_EQ(cell.column, axes[i].name) << where;
      const CellRun run = cell_run(row, axes[i]);
      const std::string error = refusal(cfg, files.expand(run.sets, dir), run.ranks);
      if (cell.refused) {
        EXPECT_FALSE(cell.what.empty()) << where;
        EXPECT_NE(error.find(cell.what), std::string::npos)
            << where << ": refused by the table with \"" << cell.what << "\", and the config gives: "
            << (error.empty() ? std::string("no error (it runs: test it)") : error);
      } else {
        EXPECT_EQ(error, "") << where << ": tested by the table, and the config refuses it";
        const std::string name = cell.what.empty() ? generic_test(row) : cell.what;
        EXPECT_TRUE(tests.count(name)) << where << ": no test " << name;
      }
    }
  }
  // The table as `meshtrain matrix` prints it.
  const auto printed = test::run_command(std::string(MESHTRAIN_BIN) + " matrix");
  ASSERT_EQ(printed.code, 0) << printed.output;
  EXPECT_EQ(printed.output, matrix_markdown());
}

class Row : public testing::TestWithParam<std::string> {};

// The row's reference on one process, then each cell the generic runner proves: the cell's mesh
// trains the 6 steps, saving a checkpoint on the way (every 3 steps, or as the row says), and one
// process resumes from its first checkpoint: the resumed steps, across the epoch boundary, equal
// the reference's too.
TEST_P(Row, Cells) {
  const MatrixRow* row = nullptr;
  for (const auto& r : parity_matrix()) row = r.name == GetParam() ? &r : row;
  ASSERT_NE(row, nullptr);
  Dir d;
  MatrixFiles files(d);
  // Runs `sets` (checkpoints every 3 steps unless the row says where): its metrics file and its saved steps.
  const auto train = [&](std::vector<std::string> sets, const std::string& tag) {
    if (std::none_of(sets.begin(), sets.end(), [](const std::string& s) { return s.rfind("checkpoint.dir=", 0) == 0; })) {
      sets.insert(sets.end(), {"checkpoint.dir=\"{dir}\"", "checkpoint.every=3"});
    }
    const std::filesystem::path dir = d.path / ("ck_" + tag);
    std::string command = std::string(MESHTRAIN_BIN) + " train " + files.config();
    for (const auto& s : files.expand(sets, dir.string())) command += " --set " + shell_quote(s);
    const std::string metrics = (d.path / (tag + ".metrics")).string();
    const auto r = test::run_command(command + " --set 'train.metrics=\"" + metrics + "\"'");
    EXPECT_EQ(r.code, 0) << tag << "\n" << r.output;
    std::vector<std::string> saved;  // step directories, oldest first
    if (std::filesystem::exists(dir)) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().filename().string().rfind("step_", 0) == 0) saved.push_back(e.path().string());
      }
    }
    std::sort(saved.begin(), saved.end());
    return std::pair{metrics, saved};
  };
  const auto [reference, reference_saved] = train(reference_sets(*row), "one");
  ASSERT_GE(reference_saved.size(), 2u) << "the reference saved no checkpoint before step 6";
  const auto& axes = matrix_axes();
  for (size_t i = 0; i < axes.size(); ++i) {
    const MatrixCell& cell = row->cells[i];
    if (cell.refused || !cell.what.empty()) continue;
    SCOPED_TRACE(row->name + " x " + axes[i].name);
    const auto [cell_metrics, saved] = train(cell_run(*row, axes[i]).sets, axes[i].name);
    expect_close_metrics(*row, reference, cell_metrics);
    ASSERT_FALSE(saved.empty()) << "no checkpoint of " << axes[i].name;
    expect_close_weights(*row, axes[i].name, reference_saved.front(), reference_saved.back(), saved.back());
    // The cell's first checkpoint, resumed on one process.
    const int from = std::stoi(std::filesystem::path(saved.front()).filename().string().substr(5));
    ASSERT_LT(from, 6) << saved.front();
    std::vector<std::string> resume = reference_sets(*row);
    resume.push_back("checkpoint.resume=\"" + saved.front() + "\"");
    expect_close_metrics(*row, reference, train(resume, axes[i].name + "_resumed").first, from);
  }
}

std::vector<std::string> row_names() {
  std::vector<std::string> out;
  for (const auto& r : parity_matrix()) out.push_back(r.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(ParityMatrix, Row, testing::ValuesIn(row_names()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace meshtrain
