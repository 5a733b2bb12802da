// The parity matrix (train/parity_matrix.h): the walk over every cell, and the
// generic runner that proves the cells it names.
//
// The walk (ParityMatrixWalk.EveryCellIsTestedOrRefused): every row has a cell
// per axis; a refused cell's config is refused by load_train_config or
// check_run (what `meshtrain train` runs before any rank starts) with its
// error; a tested cell's config is accepted and its test exists (in this
// binary, or in test_comm_mp's list); every row's one-process reference is
// accepted. The runner (ParityMatrix/Row.Cells/<row>): the reference, then
// each cell, through `meshtrain train` as a user runs it; per step the loss
// and the gradient norm within the row's tolerance, over 6 steps that cross
// an epoch (37 windows, 4 global batches of 8 per epoch).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/data/shard.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/parity_matrix.h"
#include "meshtrain/train/trainer.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"

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

// "{dir}" in the sets -> `dir`, "{data}" -> the matrix's token shard (beside `dir`).
std::vector<std::string> with_dir(std::vector<std::string> sets, const std::string& dir) {
  const std::string data = (std::filesystem::path(dir).parent_path() / "matrix.bin").string();
  for (auto& s : sets) {
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"{dir}", dir}, {"{data}", data}}) {
      for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size())) {
        s.replace(at, key.size(), value);
      }
    }
  }
  return sets;
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

TEST(ParityMatrixWalk, EveryCellIsTestedOrRefused) {
  Dir d;
  const std::string cfg = matrix_config(d);
  const std::set<std::string> tests = known_tests();
  const auto& axes = matrix_axes();
  std::set<std::string> names;
  for (const MatrixRow& row : parity_matrix()) {
    EXPECT_TRUE(names.insert(row.name).second) << "two rows named " << row.name;
    ASSERT_EQ(row.cells.size(), axes.size()) << row.name;
    const std::string dir = (d.path / ("ck_" + row.name)).string();
    EXPECT_EQ(refusal(cfg, with_dir(reference_sets(row), dir), 1), "") << row.name << ": the reference";
    for (size_t i = 0; i < axes.size(); ++i) {
      const MatrixCell& cell = row.cells[i];
      const std::string where = row.name + " x " + axes[i].name;
      EXPECT_EQ(cell.column, axes[i].name) << where;
      const CellRun run = cell_run(row, axes[i]);
      const std::string error = refusal(cfg, with_dir(run.sets, dir), run.ranks);
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

// The row's reference on one process, then each cell the generic runner proves.
TEST_P(Row, Cells) {
  const MatrixRow* row = nullptr;
  for (const auto& r : parity_matrix()) row = r.name == GetParam() ? &r : row;
  ASSERT_NE(row, nullptr);
  Dir d;
  const std::string cfg = matrix_config(d);
  const auto train = [&](const std::vector<std::string>& sets, const std::string& tag) {
    std::string command = std::string(MESHTRAIN_BIN) + " train " + cfg;
    for (const auto& s : with_dir(sets, (d.path / ("ck_" + tag)).string())) command += " --set '" + s + "'";
    const std::string metrics = (d.path / (tag + ".metrics")).string();
    const auto r = test::run_command(command + " --set 'train.metrics=\"" + metrics + "\"'");
    EXPECT_EQ(r.code, 0) << tag << "\n" << r.output;
    return metrics;
  };
  const std::string reference = train(reference_sets(*row), "one");
  const auto& axes = matrix_axes();
  for (size_t i = 0; i < axes.size(); ++i) {
    const MatrixCell& cell = row->cells[i];
    if (cell.refused || !cell.what.empty()) continue;
    SCOPED_TRACE(row->name + " x " + axes[i].name);
    const std::string cell_metrics = train(cell_run(*row, axes[i]).sets, axes[i].name);
    test::expect_close_losses(reference, cell_metrics, 0, 6, row->loss_tol, row->norm_tol);
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
