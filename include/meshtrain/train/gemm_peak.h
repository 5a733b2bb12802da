// The MFU denominator, measured rather than typed in: the fp32 GEMM rate this
// host reaches with all its cores (square matmuls through ATen, hence the BLAS
// libtorch uses), the same kind of multiplication that dominates a step.
#pragma once

namespace meshtrain {

// FLOP/s of repeated n x n x n fp32 matmuls on `threads` compute threads for
// about `seconds` (after one warm-up call), ATen and OpenBLAS both set to
// `threads`; restores both thread counts.
double measure_gemm_flops(int threads, double seconds = 0.3, int n = 512);

}  // namespace meshtrain
