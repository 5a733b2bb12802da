// The parity matrix (shared/DESIGN.md's first invariant; issue 41): every
// feature on every mesh axis either equals one process, proved by a named
// test, or is refused before any rank starts, with a named error. There is no
// third state: a combination that runs without a parity test fails the walk
// (tests/test_parity_matrix.cpp).
//
// A row is a feature: config overrides on the matrix's tiny run (gpt-tiny, 2
// layers, seq 32, global batch 8 of micro-batches of 2, lr 1e-3, 6 steps over 37
// windows: the run crosses an epoch boundary), and, for a mesh feature, the
// mesh it needs (`dp` data ranks and its parallel.* keys). A column is a mesh
// axis doubled: dp, tp, sp (tp with sequence parallelism), cp, pp, ep. A
// cell's run is the row's overrides and mesh with the column's axis set to 2
// (ranks: dp x tp x cp x pp x ep); its reference is one process with the
// row's overrides less every parallel.* key. Most tested cells are proved by
// the generic runner (ParityMatrix/Row.Cells/<row>: loss and gradient norm at
// every step within the row's tolerance), a few by the named test that
// already covers them.
//
// A post-training row trains on the data `meshtrain tokenize task --name
// arithmetic` writes (SFT conversations, preference pairs, RL prompts: the
// sets' "{task}"), QLoRA on a checkpoint of the matrix's run ("{base}").
#pragma once

#include <map>
#include <string>
#include <vector>

namespace meshtrain {

struct MatrixAxis {
  std::string name;               // dp, tp, sp, cp, pp, ep
  std::vector<std::string> sets;  // key=value (TOML values), applied after the row's
};

struct MatrixCell {
  std::string column;
  bool refused = false;
  // Tested: the test's full name ("" = the generic runner's). Refused: a
  // piece of the one error load_train_config or check_run gives.
  std::string what;
};

struct MatrixRow {
  std::string name, feature;      // "zero3", "ZeRO-3"
  // key=value; "{dir}": a scratch directory per run, "{data}": the token shard, "{task}": the task's
  // directory, "{base}": the base checkpoint's.
  std::vector<std::string> sets;
  int dp = 1;                     // data ranks of the row's own mesh
  double loss_tol = 1e-5, norm_tol = 1e-5;  // relative, per step; fp32 unless the row says why
  // The loss's tolerance is loss_tol x max(|loss|, loss_scale): an RL loss is a sum of advantage-weighted
  // terms of size ~1 that cancels to ~0 (GRPO's is 0 in exact arithmetic at step 1), so its rounding
  // follows the terms, not the sum.
  double loss_scale = 0;
  // The weights at the end: ||w_cell - w_one|| <= weight_tol x ||w_one(6) - w_one(3)||, the key
  // bias left out (tests/test_parity_matrix.cpp). fp32: measured (Intel Xeon) at most 6.3e-4
  // (LoRA on tp 2), 1e-5 .. 2e-4 on most cells.
  double weight_tol = 2e-3;
  // A column's own weight_tol where the row says why (FP8 on the layouts that round in bf16);
  // infinity: the weights are not compared there, the per-step loss and norm are.
  std::map<std::string, double> weight_tol_on;
  std::vector<std::string> metrics;  // more metrics-file keys compared per step (with loss_tol)
  std::vector<MatrixCell> cells;  // one per axis, in matrix_axes() order
};

const std::vector<MatrixAxis>& matrix_axes();
const std::vector<MatrixRow>& parity_matrix();

// The generic runner's test name for `row`.
std::string generic_test(const MatrixRow& row);

// A cell's overrides (the row's, the axis's, parallel.nproc) and its ranks.
struct CellRun {
  std::vector<std::string> sets;
  int ranks = 1;
};
CellRun cell_run(const MatrixRow& row, const MatrixAxis& axis);
// The row's one-process reference: its overrides less parallel.*.
std::vector<std::string> reference_sets(const MatrixRow& row);

// The table as Markdown: one line per row, each cell "= TEST" or "refused: ERROR".
std::string matrix_markdown();

}  // namespace meshtrain
