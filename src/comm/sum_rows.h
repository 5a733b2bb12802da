// Internal: the local sum of a reduce-scatter, in one pass.
#pragma once

#include <cstdint>

namespace meshtrain {

// out[i] = rows[0][i] + rows[1][i] + ... + rows[n-1][i] for i < m, added in
// row order (every rank of a group sums in the same order: equal results).
// One pass: each input element is read once and each output written once,
// where n-1 separate adds would read 2(n-1)m and write (n-1)m elements. `out`
// may be one of the rows.
void sum_rows(float* out, const float* const* rows, int n, int64_t m);

}  // namespace meshtrain
