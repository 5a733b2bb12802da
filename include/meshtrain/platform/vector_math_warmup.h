// MKL's vector math (VML) set up on every intra-op thread before training uses it.
//
// ATen computes exp, log, tanh, erf, sqrt, ... of fp32/fp64 CPU tensors with MKL's
// VML (ATen/cpu/vml.h, mode VML_HA), split over the intra-op threads. Measured on
// libtorch 2.11 (MKL 2024.2, 2-core Intel Xeon, 2 threads, OMP_WAIT_POLICY=PASSIVE):
// in about 1 process in 100-300 started while the host is busy, the first parallel
// exp of the process returned the second thread's half with a relative error up to
// 1.5e-4 (its second call, and every later one, within 6e-8). One process in a
// parity test then trains on other numbers than every mesh it is compared with
// (the gradient norm of the parity matrix's step 5 off by 1.2e-5). Calling each
// VML function once on the calling thread, then once on each pool thread, before
// any parallel call, removed it (0 such processes in about 1000 under the same
// load; the loop and its numbers are in issue #41's note of 2026-12-04).
#pragma once

namespace meshtrain {

// Once per process, after the intra-op thread count is set: every VML-backed
// ATen function in fp32 and fp64 on a 16-element tensor, on this thread, then
// on each of at::get_num_threads() pool threads.
void warm_up_vector_math();

}  // namespace meshtrain
