#include "meshtrain/nn/fused_ops.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

#include "meshtrain/nn/functional.h"
#include "nn/fused_kernels.h"

namespace meshtrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace k = kernels;

constexpr int64_t kGrain = 1 << 15;  // elements per thread task, at least

std::optional<k::Elem> elem(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) return std::nullopt;
  if (t.scalar_type() == at::kFloat) return k::Elem::F32;
  if (t.scalar_type() == at::kBFloat16) return k::Elem::Bf16;
  return std::nullopt;
}

// An optional fp32 vector of length n on the CPU.
bool fp32_vector_or_none(const at::Tensor& t, int64_t n) {
  return !t.defined() || (elem(t) == k::Elem::F32 && t.dim() == 1 && t.size(0) == n);
}

float* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// libtorch 1.13's Function::apply records every tensor argument and fails on an
// undefined one: an absent optional input travels as an empty tensor and is
// undefined again inside (real inputs are never empty: those run the reference).
at::Tensor absent_as_empty(const at::Tensor& t) { return t.defined() ? t : at::empty({0}); }
at::Tensor empty_as_absent(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t : at::Tensor(); }

int64_t rows_of(const at::Tensor& t) { return t.numel() / t.size(-1); }

// Rows in tasks of whole kRowBlock blocks, at least kGrain elements each.
template <typename F>
void for_row_blocks(int64_t rows, int64_t cols, F f) {
  const int64_t blocks = (rows + k::kRowBlock - 1) / k::kRowBlock;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, k::kRowBlock * cols));
  at::parallel_for(0, blocks, grain,
                   [&](int64_t b0, int64_t b1) { f(b0 * k::kRowBlock, std::min(rows, b1 * k::kRowBlock)); });
}

at::Tensor partials(bool needed, int64_t rows, int64_t cols) {
  if (!needed) return {};
  return at::empty({(rows + k::kRowBlock - 1) / k::kRowBlock, cols}, at::TensorOptions().dtype(at::kFloat));
}

// Σ over blocks of a partial buffer, [cols]; undefined stays undefined.
at::Tensor column_sums(const at::Tensor& partial) {
  if (!partial.defined()) return {};
  at::Tensor out = at::empty({partial.size(1)}, partial.options());
  k::block_sums(partial.data_ptr<float>(), partial.size(0), partial.size(1), out.data_ptr<float>());
  return out;
}

struct BiasGeluFn : torch::autograd::Function<BiasGeluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& bias_in) {
    const at::Tensor x = x_in.contiguous(), bias = empty_as_absent(bias_in);
    at::Tensor y = at::empty_like(x);
    const k::BiasGeluArgs a{x.data_ptr(), *elem(x), ptr_or_null(bias), x.size(-1)};
    at::parallel_for(0, rows_of(x), std::max<int64_t>(1, kGrain / a.cols),
                     [&](int64_t r0, int64_t r1) { k::bias_gelu_forward(a, y.data_ptr(), r0, r1); });
    ctx->save_for_backward({x, bias_in});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], bias = empty_as_absent(saved[1]);
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x);
    const k::BiasGeluArgs a{x.data_ptr(), *elem(x), ptr_or_null(bias), x.size(-1)};
    const at::Tensor part = partials(ctx->needs_input_grad(1), rows_of(x), a.cols);
    for_row_blocks(rows_of(x), a.cols, [&](int64_t r0, int64_t r1) {
      k::bias_gelu_backward(a, dy.data_ptr(), dx.data_ptr(), ptr_or_null(part), r0, r1);
    });
    return {dx, column_sums(part)};
  }
};

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g_in, const at::Tensor& u_in) {
    const at::Tensor g = g_in.contiguous(), u = u_in.contiguous();
    at::Tensor y = at::empty_like(g);
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      k::swiglu_forward(g.data_ptr(), u.data_ptr(), *elem(g), y.data_ptr(), i0, i1);
    });
    ctx->save_for_backward({g, u});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const at::Tensor dy = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      k::swiglu_backward(g.data_ptr(), u.data_ptr(), *elem(g), dy.data_ptr(), dg.data_ptr(), du.data_ptr(), i0, i1);
    });
    return {dg, du};
  }
};

k::RowArgs row_args(const at::Tensor& branch, const BranchJoin& j, const NormWeights& n) {
  k::RowArgs a;
  a.cols = branch.size(-1);
  a.branch = branch.data_ptr();
  a.type = *elem(branch);
  a.bias = ptr_or_null(j.bias);
  a.keep = j.keep.defined() ? j.keep.data_ptr() : nullptr;
  a.scale = static_cast<float>(1.0 / (1.0 - j.p));
  a.norm = n.weight.defined();
  a.rms = n.rms;
  a.w = ptr_or_null(n.weight);
  a.b = ptr_or_null(n.bias);
  a.eps = static_cast<float>(n.eps);
  return a;
}

// add_norm (with a residual) and norm (x as the branch, nothing joined): the
// outputs are {sum, y} and {y}. Saved: s (the sum, or x), mean, rstd, the mask.
struct RowsFn : torch::autograd::Function<RowsFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& residual_in, const at::Tensor& branch_in,
                               const at::Tensor& bias_in, const at::Tensor& keep_in, const at::Tensor& w_in,
                               const at::Tensor& b_in, double p, double eps, bool rms) {
    const at::Tensor branch = branch_in.contiguous();
    const at::Tensor residual = empty_as_absent(residual_in).defined() ? residual_in.contiguous() : at::Tensor();
    const at::Tensor keep = empty_as_absent(keep_in).defined() ? keep_in.contiguous() : at::Tensor();
    const at::Tensor bias = empty_as_absent(bias_in), w = empty_as_absent(w_in), b = empty_as_absent(b_in);
    const BranchJoin j{bias, keep, p};
    const NormWeights n{w, b, eps, rms};
    k::RowArgs a = row_args(branch, j, n);
    a.residual = ptr_or_null(residual);
    const int64_t rows = rows_of(branch);
    const auto f32 = branch.options().dtype(at::kFloat);
    at::Tensor sum = residual.defined() ? at::empty(branch.sizes(), f32) : at::Tensor();
    at::Tensor y = a.norm ? at::empty(branch.sizes(), f32) : at::Tensor();
    at::Tensor mean = at::empty({a.norm ? rows : 0}, f32), rstd = at::empty({a.norm ? rows : 0}, f32);
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / a.cols), [&](int64_t r0, int64_t r1) {
      k::rows_forward(a, ptr_or_null(sum), ptr_or_null(y), mean.data_ptr<float>(), rstd.data_ptr<float>(), r0, r1);
    });
    ctx->save_for_backward({residual.defined() ? sum : branch, mean, rstd, absent_as_empty(keep), w_in, b_in, bias_in});
    ctx->saved_data["p"] = p;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["branch_type"] = static_cast<int64_t>(branch.scalar_type());
    if (!residual.defined()) return {y};
    if (!a.norm) return {sum};
    return {sum, y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &mean = saved[1], &rstd = saved[2];
    const at::Tensor keep = empty_as_absent(saved[3]), w = empty_as_absent(saved[4]), b = empty_as_absent(saved[5]),
                     bias = empty_as_absent(saved[6]);
    const bool has_residual = ctx->saved_data["residual"].toBool();
    const auto branch_type = static_cast<at::ScalarType>(ctx->saved_data["branch_type"].toInt());
    // Inputs: residual, branch, bias, keep, w, b, then the three numbers.
    const bool wants[3] = {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    const NormWeights n{w, b, ctx->saved_data["eps"].toDouble(), ctx->saved_data["rms"].toBool()};
    const BranchJoin j{bias, keep, ctx->saved_data["p"].toDouble()};
    // The branch pointer is not read backward; s stands in for its shape.
    k::RowArgs a = row_args(s, j, n);
    a.type = branch_type == at::kFloat ? k::Elem::F32 : k::Elem::Bf16;
    const auto contiguous_or_none = [](const at::Tensor& t) { return t.defined() ? t.contiguous() : t; };
    const at::Tensor ds_out = has_residual ? contiguous_or_none(grads[0]) : at::Tensor();
    at::Tensor dy = a.norm ? contiguous_or_none(grads[has_residual ? 1 : 0]) : at::Tensor();
    if (a.norm && !dy.defined()) dy = at::zeros_like(s);
    const int64_t rows = rows_of(s);
    // Without a residual, the input's gradient is ds (fp32, as x is).
    const bool want_residual = has_residual ? wants[0] : wants[1];
    at::Tensor d_residual = want_residual ? at::empty_like(s) : at::Tensor();
    const bool branch_is_ds = !has_residual || (!keep.defined() && branch_type == at::kFloat);
    at::Tensor d_branch =
        has_residual && wants[1] && !branch_is_ds ? at::empty(s.sizes(), s.options().dtype(branch_type)) : at::Tensor();
    const at::Tensor bias_part = partials(wants[2], rows, a.cols);
    const at::Tensor w_part = partials(a.norm && ctx->needs_input_grad(4), rows, a.cols);
    const at::Tensor b_part = partials(a.norm && ctx->needs_input_grad(5), rows, a.cols);
    if (has_residual && wants[1] && branch_is_ds && !d_residual.defined()) d_residual = at::empty_like(s);
    k::RowGradOut out{ptr_or_null(d_residual), d_branch.defined() ? d_branch.data_ptr() : nullptr,
                      ptr_or_null(bias_part), ptr_or_null(w_part), ptr_or_null(b_part)};
    for_row_blocks(rows, a.cols, [&](int64_t r0, int64_t r1) {
      k::rows_backward(a, s.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(), ptr_or_null(dy),
                       ptr_or_null(ds_out), out, r0, r1);
    });
    if (!has_residual) {  // norm(x): the inputs' order is residual, branch (= x), ...
      return {at::Tensor(),        d_residual,   at::Tensor(), at::Tensor(), column_sums(w_part),
              column_sums(b_part), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (branch_is_ds && wants[1]) d_branch = d_residual;
    return {wants[0] ? d_residual : at::Tensor(),
            d_branch,
            column_sums(bias_part),
            at::Tensor(),
            column_sums(w_part),
            column_sums(b_part),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

bool norm_supported(const NormWeights& n, int64_t h) {
  return fp32_vector_or_none(n.weight, h) && fp32_vector_or_none(n.bias, h) && (!n.bias.defined() || !n.rms);
}

}  // namespace

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias) {
  if (!elem(x) || x.numel() == 0 || !fp32_vector_or_none(bias, x.size(-1))) return bias_gelu_reference(x, bias);
  return BiasGeluFn::apply(x, absent_as_empty(bias));
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (!elem(gate) || gate.numel() == 0 || gate.scalar_type() != up.scalar_type() || gate.sizes() != up.sizes() ||
      !up.device().is_cpu()) {
    return swiglu_reference(gate, up);
  }
  return SwigluFn::apply(gate, up);
}

at::Tensor norm(const at::Tensor& x, const NormWeights& n) {
  if (elem(x) != k::Elem::F32 || x.numel() == 0 || !n.weight.defined() || !norm_supported(n, x.size(-1))) {
    return norm_reference(x, n);
  }
  const at::Tensor none = at::empty({0});
  return RowsFn::apply(none, x, none, none, n.weight, absent_as_empty(n.bias), 0.0, n.eps, n.rms)[0];
}

std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& residual, const at::Tensor& branch, const BranchJoin& j,
                                           const NormWeights& n) {
  const bool ok =
      elem(residual) == k::Elem::F32 && elem(branch) && residual.numel() > 0 && residual.sizes() == branch.sizes() &&
      fp32_vector_or_none(j.bias, branch.size(-1)) && norm_supported(n, branch.size(-1)) &&
      (!j.keep.defined() || (j.keep.scalar_type() == branch.scalar_type() && j.keep.sizes() == branch.sizes()));
  if (!ok) return add_norm_reference(residual, branch, j, n);
  const variable_list out =
      RowsFn::apply(residual, branch, absent_as_empty(j.bias), absent_as_empty(j.keep), absent_as_empty(n.weight),
                    absent_as_empty(n.bias), j.keep.defined() ? j.p : 0.0, n.eps, n.rms);
  return {out[0], out.size() > 1 ? out[1] : at::Tensor()};
}

at::Tensor bias_gelu_reference(const at::Tensor& x, const at::Tensor& bias) {
  // The bias in x's type, as autocast's GEMM adds it (the result keeps x's type).
  return at::gelu(bias.defined() ? x + bias.to(x.scalar_type()) : x, "tanh");
}

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor norm_reference(const at::Tensor& x, const NormWeights& n) {
  return n.rms ? rms_norm(x, n.weight, n.eps) : layer_norm(x, n.weight, n.bias, n.eps);
}

std::pair<at::Tensor, at::Tensor> add_norm_reference(const at::Tensor& residual, const at::Tensor& branch,
                                                     const BranchJoin& j, const NormWeights& n) {
  at::Tensor a = j.bias.defined() ? branch + j.bias : branch;
  if (j.keep.defined()) a = a * j.keep * (1.0 / (1.0 - j.p));  // nn::dropout's roundings
  const at::Tensor sum = residual + a;
  return {sum, n.weight.defined() ? norm_reference(sum, n) : at::Tensor()};
}

}  // namespace meshtrain::nn
