#include "meshtrain/comm/autograd.h"

#include <ATen/Functions.h>
#include <ATen/WrapDimUtils.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <torch/csrc/autograd/custom_function.h>

#include "meshtrain/comm/comm.h"

namespace meshtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The Comm a node talks to is kept in the context as an integer (IValue holds no raw pointers).
void save_comm(AutogradContext* ctx, Comm& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}
Comm& load_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

int64_t check_divisible(const at::Tensor& x, Comm& comm, int64_t dim, const char* what) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  if (x.size(dim) % comm.size() != 0) {
    throw std::invalid_argument(fmt::format("{}: dim {} of size {} is not divisible by group '{}' of size {}", what,
                                            dim, x.size(dim), comm.name(), comm.size()));
  }
  return dim;
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm) {
    save_comm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor grad = g[0].contiguous().clone();
    load_comm(ctx).all_reduce(grad);
    return {grad, at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm) {
    at::Tensor y = x.contiguous().clone();
    comm->all_reduce(y);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {g[0], at::Tensor()}; }
};

// A collective along one dim whose backward is another collective along the
// same dim (the adjoint pairs of the table in autograd.h).
using DimOp = at::Tensor (*)(const at::Tensor&, Comm&, int64_t);
template <DimOp Forward, DimOp Backward>
struct DimCollective : torch::autograd::Function<DimCollective<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm, int64_t dim) {
    save_comm(ctx, *comm);
    ctx->saved_data["dim"] = dim;
    return Forward(x, *comm, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {Backward(g[0], load_comm(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct AllToAllDims : torch::autograd::Function<AllToAllDims> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm, int64_t split_dim,
                            int64_t concat_dim) {
    save_comm(ctx, *comm);
    ctx->saved_data["split"] = split_dim;
    ctx->saved_data["concat"] = concat_dim;
    return all_to_all_along(x, *comm, split_dim, concat_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    // The adjoint of a permutation of chunks is the inverse permutation.
    return {all_to_all_along(g[0], load_comm(ctx), ctx->saved_data["concat"].toInt(),
                             ctx->saved_data["split"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::atomic<int64_t> exchange_ns{0};  // all_to_all_rows_seconds()

// Uneven row blocks; the adjoint swaps what is sent and what is received.
at::Tensor exchange_rows(const at::Tensor& x, Comm& comm, const std::vector<int64_t>& send,
                         const std::vector<int64_t>& recv) {
  const auto t0 = std::chrono::steady_clock::now();
  int64_t rows = 0;
  for (int64_t r : recv) rows += r;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[0] = rows;
  at::Tensor out = at::empty(shape, x.options());
  comm.all_to_all(out, x.contiguous(), recv, send);
  exchange_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm, std::vector<int64_t> send,
                            std::vector<int64_t> recv) {
    save_comm(ctx, *comm);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange_rows(x, *comm, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {exchange_rows(g[0], load_comm(ctx), recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

double all_to_all_rows_seconds() { return static_cast<double>(exchange_ns.load()) * 1e-9; }

at::Tensor all_to_all_rows(const at::Tensor& x, Comm& comm, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv) {
  if (static_cast<int>(send.size()) != comm.size() || static_cast<int>(recv.size()) != comm.size()) {
    throw std::invalid_argument(fmt::format("all_to_all_rows: {} send and {} receive counts for group '{}' of {} ranks",
                                            send.size(), recv.size(), comm.name(), comm.size()));
  }
  int64_t rows = 0;
  for (int64_t r : send) rows += r;
  if (rows != x.size(0)) {
    throw std::invalid_argument(fmt::format("all_to_all_rows: send counts add up to {} rows, x has {}", rows, x.size(0)));
  }
  if (comm.size() == 1) return x;
  return AllToAllRows::apply(x, &comm, send, recv);
}

// Adjoint pairs: split <-> gather (tensor parallel), gather <-> reduce-scatter
// (sequence parallel).
using ScatterToRegion = DimCollective<chunk_along, gather_along>;
using GatherFromRegion = DimCollective<gather_along, chunk_along>;
using AllGatherSeq = DimCollective<gather_along, reduce_scatter_along>;
using ReduceScatterSeq = DimCollective<reduce_scatter_along, gather_along>;

at::Tensor chunk_along(const at::Tensor& x, Comm& comm, int64_t dim) {
  dim = check_divisible(x, comm, dim, "split");
  return x.chunk(comm.size(), dim)[comm.rank()].contiguous();
}

at::Tensor gather_along(const at::Tensor& x, Comm& comm, int64_t dim) {
  dim = at::maybe_wrap_dim(dim, x.dim());
  const int n = comm.size();
  if (n == 1) return x;
  at::Tensor in = x.contiguous();
  // Gather into [n, *x.shape], then move the rank axis next to `dim` and merge.
  std::vector<int64_t> shape{n};
  for (auto s : in.sizes()) shape.push_back(s);
  at::Tensor buf = at::empty(shape, in.options());
  comm.all_gather(buf, in);
  if (dim == 0) return buf.view([&] {
    std::vector<int64_t> s(in.sizes().begin(), in.sizes().end());
    s[0] *= n;
    return s;
  }());
  return at::cat(buf.unbind(0), dim);
}

at::Tensor reduce_scatter_along(const at::Tensor& x, Comm& comm, int64_t dim) {
  dim = check_divisible(x, comm, dim, "reduce_scatter");
  const int n = comm.size();
  if (n == 1) return x;
  // Chunk r along `dim` goes to rank r: lay the chunks out contiguously.
  at::Tensor in = dim == 0 ? x.contiguous() : at::stack(x.chunk(n, dim), 0).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape[dim] /= n;
  at::Tensor out = at::empty(out_shape, x.options());
  comm.reduce_scatter(out, in);
  return out;
}

at::Tensor all_to_all_along(const at::Tensor& x, Comm& comm, int64_t split_dim, int64_t concat_dim) {
  split_dim = check_divisible(x, comm, split_dim, "all_to_all");
  concat_dim = at::maybe_wrap_dim(concat_dim, x.dim());
  const int n = comm.size();
  if (n == 1) return x;
  at::Tensor in = at::stack(x.chunk(n, split_dim), 0).contiguous();  // [n, ...chunk]
  at::Tensor out = at::empty_like(in);
  comm.all_to_all(out, in);
  return at::cat(out.unbind(0), concat_dim);
}

at::Tensor copy_to_region(const at::Tensor& x, Comm& comm) {
  if (comm.size() == 1) return x;
  return CopyToRegion::apply(x, &comm);
}
at::Tensor reduce_from_region(const at::Tensor& x, Comm& comm) {
  if (comm.size() == 1) return x;
  return ReduceFromRegion::apply(x, &comm);
}
at::Tensor scatter_to_region(const at::Tensor& x, Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return ScatterToRegion::apply(x, &comm, dim);
}
at::Tensor gather_from_region(const at::Tensor& x, Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return GatherFromRegion::apply(x, &comm, dim);
}
at::Tensor all_gather_seq(const at::Tensor& x, Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return AllGatherSeq::apply(x, &comm, dim);
}
at::Tensor reduce_scatter_seq(const at::Tensor& x, Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return ReduceScatterSeq::apply(x, &comm, dim);
}
at::Tensor all_to_all_dims(const at::Tensor& x, Comm& comm, int64_t split_dim, int64_t concat_dim) {
  if (comm.size() == 1) return x;
  return AllToAllDims::apply(x, &comm, split_dim, concat_dim);
}

}  // namespace meshtrain
