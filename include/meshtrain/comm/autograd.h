// Collectives as autograd functions: the forward and backward pairs tensor,
// sequence and expert parallelism are built from (Megatron-LM, arXiv 1909.08053
// section 3; Korthikanti et al., arXiv 2205.05198 section 4.2.2).
//
//   function              forward                    backward
//   copy_to_region        identity                   all-reduce (sum)      Megatron's f
//   reduce_from_region    all-reduce (sum)           identity              Megatron's g
//   scatter_to_region     keep my chunk along dim    all-gather along dim
//   gather_from_region    all-gather along dim       keep my chunk
//   all_gather_seq        all-gather along dim       reduce-scatter        SP's g
//   reduce_scatter_seq    reduce-scatter along dim   all-gather            SP's g-bar
//   all_to_all_dims       split dim a, gather dim b  the inverse           Ulysses
//   all_to_all_rows       uneven row blocks          the blocks sent back  MoE dispatch and combine
//
// Each backward is the adjoint of its forward, so gradients equal the
// single-process ones; tests/test_autograd_mp.cpp checks every one against
// finite differences across real ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace meshtrain {

class Comm;

at::Tensor copy_to_region(const at::Tensor& x, Comm& comm);
at::Tensor reduce_from_region(const at::Tensor& x, Comm& comm);
at::Tensor scatter_to_region(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor gather_from_region(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor all_gather_seq(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor reduce_scatter_seq(const at::Tensor& x, Comm& comm, int64_t dim);
// x's `split_dim` is divided into comm.size() chunks, chunk r goes to rank r;
// the chunks received are concatenated along `concat_dim`.
at::Tensor all_to_all_dims(const at::Tensor& x, Comm& comm, int64_t split_dim, int64_t concat_dim);

// Rows of x [N, ...] in blocks: the first send[0] rows go to rank 0, the next
// send[1] to rank 1, ...; recv[r] rows come from rank r, concatenated in rank
// order. Every rank's send[r] must equal rank r's recv[me] (checked by the
// transport). Backward sends each block's gradient back where it came from.
at::Tensor all_to_all_rows(const at::Tensor& x, Comm& comm, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv);
// Seconds this process has spent inside all_to_all_rows exchanges, forward and
// backward (what the MoE dispatch and combine cost: the step log's share).
double all_to_all_rows_seconds();

// Plain (non-autograd) helpers along a dim, used by the functions above.
at::Tensor gather_along(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor reduce_scatter_along(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor chunk_along(const at::Tensor& x, Comm& comm, int64_t dim);
at::Tensor all_to_all_along(const at::Tensor& x, Comm& comm, int64_t split_dim, int64_t concat_dim);

}  // namespace meshtrain
