#include "nn/fused_kernels.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <utility>
#include <bit>
#include <cmath>
#include <vector>

namespace meshtrain::nn::kernels {
namespace {

#define MESHTRAIN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define MESHTRAIN_INLINE inline __attribute__((always_inline))
// Lambdas too: one left out of line is compiled for the default instruction set, not the clone's.
#define MESHTRAIN_LAMBDA __attribute__((always_inline))

constexpr int kLanes = 16;

MESHTRAIN_INLINE float bf16_to_float(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

// Round to nearest even, NaN kept quiet (c10::BFloat16's round_to_nearest_even).
MESHTRAIN_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7fffu)) >> 16;
  return f != f ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

template <typename T>
MESHTRAIN_INLINE float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else {
    return bf16_to_float(p[i]);
  }
}

template <typename T>
MESHTRAIN_INLINE void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>) {
    p[i] = v;
  } else {
    p[i] = float_to_bf16(v);
  }
}

// e^x, vectorisable: Cody-Waite reduction x = n ln2 + r and Cephes expf's
// degree-6 polynomial for e^r (|error| about 1 ulp); x clamped to [-87, 88]
// so that 2^n stays a normal float (e^-87 is 1.6e-38: σ of it is 0 to fp32).
MESHTRAIN_INLINE float exp_f(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = x * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t + 127.5f) - 127;  // round(t): t + 127.5 > 0 truncates down
  const float nf = static_cast<float>(n);
  float r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  return e * std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
}

MESHTRAIN_INLINE float sigmoid(float z) { return 1.0f / (1.0f + exp_f(-z)); }

// f(true_type) or f(false_type): a loop's optional input decided once, outside it.
template <typename F>
MESHTRAIN_INLINE void branch_on(bool b, F f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

constexpr float kGeluA = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluB = 0.044715f;

// The math on fp32 spans of n elements.
template <bool kBias>
MESHTRAIN_INLINE void gelu_span_fwd(const float* x, const float* bias, float* y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    float u = x[c];
    if constexpr (kBias) u += bias[c];
    const float z = kGeluA * (u + kGeluB * u * u * u);
    y[c] = u * sigmoid(2.0f * z);
  }
}

template <bool kBias, bool kSums>
MESHTRAIN_INLINE void gelu_span_bwd(const float* x, const float* bias, const float* dy, float* dx, float* acc,
                                    int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    float u = x[c];
    if constexpr (kBias) u += bias[c];
    const float z = kGeluA * (u + kGeluB * u * u * u);
    const float s = sigmoid(2.0f * z);
    const float dz = kGeluA * (1.0f + 3.0f * kGeluB * u * u);
    const float d = dy[c] * (s + u * s * (1.0f - s) * 2.0f * dz);
    dx[c] = d;
    if constexpr (kSums) acc[c] += d;
  }
}

MESHTRAIN_INLINE void swiglu_span_fwd(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

MESHTRAIN_INLINE void swiglu_span_bwd(const float* g, const float* u, const float* dy, float* dg, float* du,
                                      int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]);
    du[i] = dy[i] * g[i] * s;
    dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

// f(offset, length, inputs, outputs) over [0, n) with fp32 spans: fp32 data
// directly; bf16 data a chunk at a time through stack buffers (loops that mix
// 16- and 32-bit elements vectorise poorly; these conversions vectorise well).
constexpr int64_t kChunk = 512;

template <typename T, size_t kIn, size_t kOut, typename F>
MESHTRAIN_INLINE void as_fp32(const std::array<const T*, kIn>& in, const std::array<T*, kOut>& out, int64_t n, F f) {
  if constexpr (std::is_same_v<T, float>) {
    f(int64_t{0}, n, in.data(), out.data());
  } else {
    float ib[kIn][kChunk], ob[kOut][kChunk];
    std::array<const float*, kIn> ip;
    std::array<float*, kOut> op;
    for (size_t k = 0; k < kIn; ++k) ip[k] = ib[k];
    for (size_t k = 0; k < kOut; ++k) op[k] = ob[k];
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t len = std::min(kChunk, n - c0);
      for (size_t k = 0; k < kIn; ++k) {
        for (int64_t i = 0; i < len; ++i) ib[k][i] = bf16_to_float(in[k][c0 + i]);
      }
      f(c0, len, ip.data(), op.data());
      for (size_t k = 0; k < kOut; ++k) {
        for (int64_t i = 0; i < len; ++i) out[k][c0 + i] = float_to_bf16(ob[k][i]);
      }
    }
  }
}

template <typename T>
MESHTRAIN_INLINE void gelu_fwd(const BiasGeluArgs a, T* y, int64_t row0, int64_t row1) {
  const T* x = static_cast<const T*>(a.x);
  branch_on(a.bias != nullptr, [&](auto has_bias) MESHTRAIN_LAMBDA {
    for (int64_t r = row0; r < row1; ++r) {
      const int64_t o = r * a.cols;
      as_fp32<T, 1, 1>({x + o}, {y + o}, a.cols, [&](int64_t c0, int64_t len, const float* const* in, float* const* out) MESHTRAIN_LAMBDA {
        gelu_span_fwd<has_bias>(in[0], has_bias ? a.bias + c0 : nullptr, out[0], len);
      });
    }
  });
}

template <typename T>
MESHTRAIN_INLINE void gelu_bwd(const BiasGeluArgs a, const T* dy, T* dx, float* partial, int64_t row0, int64_t row1) {
  const T* x = static_cast<const T*>(a.x);
  branch_on(a.bias != nullptr, [&](auto has_bias) MESHTRAIN_LAMBDA {
    branch_on(partial != nullptr, [&](auto sums) MESHTRAIN_LAMBDA {
      float* acc = nullptr;
      for (int64_t r = row0; r < row1; ++r) {
        if constexpr (sums) {
          if (r == row0 || r % kRowBlock == 0) {
            acc = partial + (r / kRowBlock) * a.cols;
            std::fill(acc, acc + a.cols, 0.0f);
          }
        }
        const int64_t o = r * a.cols;
        as_fp32<T, 2, 1>({x + o, dy + o}, {dx + o}, a.cols,
                         [&](int64_t c0, int64_t len, const float* const* in, float* const* out) MESHTRAIN_LAMBDA {
                           gelu_span_bwd<has_bias, sums>(in[0], has_bias ? a.bias + c0 : nullptr, in[1], out[0],
                                                         sums ? acc + c0 : nullptr, len);
                         });
      }
    });
  });
}

template <typename T>
MESHTRAIN_INLINE void swiglu_fwd(const T* g, const T* u, T* y, int64_t i0, int64_t i1) {
  as_fp32<T, 2, 1>({g + i0, u + i0}, {y + i0}, i1 - i0, [](int64_t, int64_t len, const float* const* in, float* const* out) MESHTRAIN_LAMBDA {
    swiglu_span_fwd(in[0], in[1], out[0], len);
  });
}

template <typename T>
MESHTRAIN_INLINE void swiglu_bwd(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t i0, int64_t i1) {
  as_fp32<T, 3, 2>({g + i0, u + i0, dy + i0}, {dg + i0, du + i0}, i1 - i0,
                   [](int64_t, int64_t len, const float* const* in, float* const* out) MESHTRAIN_LAMBDA {
                     swiglu_span_bwd(in[0], in[1], in[2], out[0], out[1], len);
                   });
}

// Sum of f(c) over c in [0, n): 16 lanes, then the lanes and the tail in order.
template <typename F>
MESHTRAIN_INLINE float row_sum(int64_t n, F f) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] += f(c + j);
  }
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += lane[j];
  for (; c < n; ++c) s += f(c);
  return s;
}

// Two sums of f(c) = {x, y} at once, in row_sum's order.
template <typename F>
MESHTRAIN_INLINE std::pair<float, float> row_sum2(int64_t n, F f) {
  float lx[kLanes] = {}, ly[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const auto [x, y] = f(c + j);
      lx[j] += x;
      ly[j] += y;
    }
  }
  float sx = 0, sy = 0;
  for (int j = 0; j < kLanes; ++j) sx += lx[j], sy += ly[j];
  for (; c < n; ++c) {
    const auto [x, y] = f(c);
    sx += x;
    sy += y;
  }
  return {sx, sy};
}

// A row of T as fp32: the row itself, or converted into buf (a loop of its own: see as_fp32).
template <typename T>
MESHTRAIN_INLINE const float* row_fp32(const T* p, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = bf16_to_float(p[i]);
    return buf;
  }
}

template <typename T>
MESHTRAIN_INLINE void rows_fwd(const RowArgs a, float* sum, float* y, float* mean, float* rstd, int64_t row0,
                               int64_t row1) {
  const T* branch = static_cast<const T*>(a.branch);
  const T* keep = static_cast<const T*>(a.keep);
  const int64_t n = a.cols;
  // The sum's row when it is not kept, then the branch and mask rows as fp32.
  std::vector<float> scratch(3 * static_cast<size_t>(n));
  for (int64_t r = row0; r < row1; ++r) {
    const int64_t o = r * n;
    float* s = sum ? sum + o : scratch.data();
    const float* bv = row_fp32(branch + o, scratch.data() + n, n);
    const float* kv = keep ? row_fp32(keep + o, scratch.data() + 2 * n, n) : nullptr;
    // s, and in the same pass Σ s (LayerNorm's mean) or Σ s² (RMSNorm's).
    float total = 0;
    branch_on(a.residual != nullptr, [&](auto has_residual) MESHTRAIN_LAMBDA {
      branch_on(a.bias != nullptr, [&](auto has_bias) MESHTRAIN_LAMBDA {
        branch_on(keep != nullptr, [&](auto has_keep) MESHTRAIN_LAMBDA {
          auto value = [&](int64_t c) MESHTRAIN_LAMBDA {
            float v = bv[c];
            if constexpr (has_bias) v += a.bias[c];
            if constexpr (has_keep) v = v * (kv[c] * a.scale);
            if constexpr (has_residual) v = a.residual[o + c] + v;
            s[c] = v;
            return v;
          };
          if (a.rms) {
            total = row_sum(n, [&](int64_t c) MESHTRAIN_LAMBDA {
              const float v = value(c);
              return v * v;
            });
          } else {
            total = row_sum(n, value);
          }
        });
      });
    });
    if (!a.norm) continue;
    float m = 0, var;
    if (a.rms) {
      var = total / static_cast<float>(n);
    } else {
      m = total / static_cast<float>(n);
      var = row_sum(n, [&](int64_t c) MESHTRAIN_LAMBDA { return (s[c] - m) * (s[c] - m); }) / static_cast<float>(n);
    }
    const float rs = 1.0f / std::sqrt(var + a.eps);
    mean[r] = m;
    rstd[r] = rs;
    branch_on(a.b != nullptr, [&](auto has_b) MESHTRAIN_LAMBDA {
      for (int64_t c = 0; c < n; ++c) {
        const float v = (s[c] - m) * rs * a.w[c];
        if constexpr (has_b) {
          y[o + c] = v + a.b[c];
        } else {
          y[o + c] = v;
        }
      }
    });
  }
}

template <typename T>
MESHTRAIN_INLINE void rows_bwd(const RowArgs a, const float* s, const float* mean, const float* rstd, const float* dy,
                               const float* ds_out, const RowGradOut out, int64_t row0, int64_t row1) {
  const T* keep = static_cast<const T*>(a.keep);
  T* d_branch = static_cast<T*>(out.d_branch);
  const int64_t n = a.cols;
  // ds, the three column sums where the caller wants none (written, not read), d_branch and the mask in fp32.
  std::vector<float> scratch(6 * static_cast<size_t>(n));
  float* ds = scratch.data();
  float* dbuf = scratch.data() + 4 * n;
  float* kbuf = scratch.data() + 5 * n;
  float *bias_acc = nullptr, *w_acc = nullptr, *b_acc = nullptr;
  for (int64_t r = row0; r < row1; ++r) {
    if (r == row0 || r % kRowBlock == 0) {
      const int64_t at = (r / kRowBlock) * n;
      float* spare = scratch.data() + n;
      for (auto [dst, src] :
           {std::pair{&bias_acc, out.bias_partial}, {&w_acc, out.w_partial}, {&b_acc, out.b_partial}}) {
        *dst = src ? src + at : spare;
        spare += n;
        std::fill(*dst, *dst + n, 0.0f);
      }
    }
    const int64_t o = r * n;
    branch_on(ds_out != nullptr, [&](auto has_ds_out) MESHTRAIN_LAMBDA {
      if (a.norm) {
        const float m = mean[r], rs = rstd[r];
        const float* g = dy + o;
        const float* x = s + o;
        // mean(g·ŝ) and mean(g) in one pass.
        float c1, c2 = 0;
        if (a.rms) {
          c1 = row_sum(n, [&](int64_t c) MESHTRAIN_LAMBDA { return g[c] * a.w[c] * ((x[c] - m) * rs); });
        } else {
          std::tie(c1, c2) = row_sum2(n, [&](int64_t c) MESHTRAIN_LAMBDA {
            const float gw = g[c] * a.w[c];
            return std::pair{gw * ((x[c] - m) * rs), gw};
          });
        }
        c1 /= static_cast<float>(n);
        c2 /= static_cast<float>(n);
        for (int64_t c = 0; c < n; ++c) {
          const float hat = (x[c] - m) * rs;
          const float d = rs * (g[c] * a.w[c] - c2 - hat * c1);
          if constexpr (has_ds_out) {
            ds[c] = ds_out[o + c] + d;
          } else {
            ds[c] = d;
          }
          w_acc[c] += g[c] * hat;
          b_acc[c] += g[c];
        }
      } else {
        for (int64_t c = 0; c < n; ++c) {
          if constexpr (has_ds_out) {
            ds[c] = ds_out[o + c];
          } else {
            ds[c] = 0.0f;
          }
        }
      }
    });
    // d_branch's row in fp32 (in place of ds when the branch is fp32 too), converted after.
    const float* kv = keep ? row_fp32(keep + o, kbuf, n) : nullptr;
    float* db = std::is_same_v<T, float> && d_branch ? reinterpret_cast<float*>(d_branch) + o : dbuf;
    branch_on(keep != nullptr, [&](auto has_keep) MESHTRAIN_LAMBDA {
      branch_on(out.d_residual != nullptr, [&](auto has_residual) MESHTRAIN_LAMBDA {
        for (int64_t c = 0; c < n; ++c) {
          if constexpr (has_residual) out.d_residual[o + c] = ds[c];
          float d = ds[c];
          if constexpr (has_keep) d = d * (kv[c] * a.scale);
          db[c] = d;
          bias_acc[c] += d;
        }
      });
    });
    if constexpr (!std::is_same_v<T, float>) {
      if (d_branch) {
        for (int64_t c = 0; c < n; ++c) d_branch[o + c] = float_to_bf16(db[c]);
      }
    }
  }
}

}  // namespace

MESHTRAIN_CLONES void bias_gelu_forward(const BiasGeluArgs& a, void* y, int64_t row0, int64_t row1) {
  if (a.type == Elem::F32) {
    gelu_fwd(a, static_cast<float*>(y), row0, row1);
  } else {
    gelu_fwd(a, static_cast<uint16_t*>(y), row0, row1);
  }
}

MESHTRAIN_CLONES void bias_gelu_backward(const BiasGeluArgs& a, const void* dy, void* dx, float* bias_partial,
                                         int64_t row0, int64_t row1) {
  if (a.type == Elem::F32) {
    gelu_bwd(a, static_cast<const float*>(dy), static_cast<float*>(dx), bias_partial, row0, row1);
  } else {
    gelu_bwd(a, static_cast<const uint16_t*>(dy), static_cast<uint16_t*>(dx), bias_partial, row0, row1);
  }
}

MESHTRAIN_CLONES void swiglu_forward(const void* gate, const void* up, Elem type, void* y, int64_t i0, int64_t i1) {
  if (type == Elem::F32) {
    swiglu_fwd(static_cast<const float*>(gate), static_cast<const float*>(up), static_cast<float*>(y), i0, i1);
  } else {
    swiglu_fwd(static_cast<const uint16_t*>(gate), static_cast<const uint16_t*>(up), static_cast<uint16_t*>(y), i0, i1);
  }
}

MESHTRAIN_CLONES void swiglu_backward(const void* gate, const void* up, Elem type, const void* dy, void* dgate,
                                      void* dup, int64_t i0, int64_t i1) {
  if (type == Elem::F32) {
    swiglu_bwd(static_cast<const float*>(gate), static_cast<const float*>(up), static_cast<const float*>(dy),
               static_cast<float*>(dgate), static_cast<float*>(dup), i0, i1);
  } else {
    swiglu_bwd(static_cast<const uint16_t*>(gate), static_cast<const uint16_t*>(up), static_cast<const uint16_t*>(dy),
               static_cast<uint16_t*>(dgate), static_cast<uint16_t*>(dup), i0, i1);
  }
}

MESHTRAIN_CLONES void rows_forward(const RowArgs& a, float* sum, float* y, float* mean, float* rstd, int64_t row0,
                                   int64_t row1) {
  if (a.type == Elem::F32) {
    rows_fwd<float>(a, sum, y, mean, rstd, row0, row1);
  } else {
    rows_fwd<uint16_t>(a, sum, y, mean, rstd, row0, row1);
  }
}

MESHTRAIN_CLONES void rows_backward(const RowArgs& a, const float* s, const float* mean, const float* rstd,
                                    const float* dy, const float* ds_out, const RowGradOut& out, int64_t row0,
                                    int64_t row1) {
  if (a.type == Elem::F32) {
    rows_bwd<float>(a, s, mean, rstd, dy, ds_out, out, row0, row1);
  } else {
    rows_bwd<uint16_t>(a, s, mean, rstd, dy, ds_out, out, row0, row1);
  }
}

MESHTRAIN_CLONES void block_sums(const float* partial, int64_t blocks, int64_t cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int64_t k = 0; k < blocks; ++k) {
    for (int64_t c = 0; c < cols; ++c) out[c] += partial[k * cols + c];
  }
}

}  // namespace meshtrain::nn::kernels
