#include "kernels_cpu.hpp"

#include "strata/core/error.hpp"
#include "strata/core/math/gpt.hpp"
#include "strata/core/math/half.hpp"

#include "strata/core/target_clones.hpp"

namespace strata::detail {

STRATA_CLONES void gelu_forward(const float* in, float* out, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) out[i] = math::gelu(in[i]);
}

STRATA_CLONES void gelu_backward(float* grad, const float* in, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) grad[i] *= math::gelu_grad(in[i]);
}

STRATA_CLONES void add_bias_rows(float* y, const float* bias, long rows, int n) {
  for (long r = 0; r < rows; ++r)
#pragma omp simd
    for (int j = 0; j < n; ++j) y[r * n + j] += bias[j];
}

STRATA_CLONES void add_into(float* y, const float* x, long n) {
  for (long i = 0; i < n; ++i) y[i] += x[i];
}

STRATA_CLONES void layernorm_rows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                  long r0, long r1, int n) {
  for (long r = r0; r < r1; ++r) math::layernorm_row(x + r * n, w, b, y + r * n, n, mean + r, rstd + r);
}

STRATA_CLONES void layernorm_backward_rows(const float* dy, const float* x, const float* w, const float* mean,
                                           const float* rstd, float* dx, float* dw, float* db, long r0, long r1,
                                           int n) {
  for (long r = r0; r < r1; ++r)
    math::layernorm_row_backward(dy + r * n, x + r * n, w, mean[r], rstd[r], n, dx + r * n, dw, db);
}

STRATA_CLONES void rmsnorm_rows(const float* x, const float* w, float* y, float* rstd, long r0, long r1, int n,
                                float eps) {
  for (long r = r0; r < r1; ++r) math::rmsnorm_row(x + r * n, w, y + r * n, n, eps, rstd + r);
}

STRATA_CLONES void rmsnorm_backward_rows(const float* dy, const float* x, const float* w, const float* rstd,
                                         float* dx, float* dw, long r0, long r1, int n) {
  for (long r = r0; r < r1; ++r) math::rmsnorm_row_backward(dy + r * n, x + r * n, w, rstd[r], n, dx + r * n, dw);
}

STRATA_CLONES void swiglu_forward(const float* gu, float* out, long rows, int f) {
  for (long r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * f;
    const float* u = g + f;
#pragma omp simd
    for (int j = 0; j < f; ++j) out[r * f + j] = math::silu(g[j]) * u[j];
  }
}

STRATA_CLONES void swiglu_backward(const float* dout, const float* gu, float* dgu, long rows, int f) {
  for (long r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * f;
    const float* u = g + f;
    const float* d = dout + r * f;
    float* dg = dgu + r * 2 * f;
    float* du = dg + f;
#pragma omp simd
    for (int j = 0; j < f; ++j) {
      dg[j] = d[j] * u[j] * math::silu_grad(g[j]);
      du[j] = d[j] * math::silu(g[j]);
    }
  }
}

STRATA_CLONES float max_of(const float* x, int n) {
  // A max is the same in any order (for values that are not NaN), so it vectorises.
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

double exp_shifted(const float* s, float* p, int n, float m) {
  return exp_scaled(s, p, n, 1.0f, m);  // 1 * s[j] is s[j] exactly
}

STRATA_CLONES double exp_scaled(const float* s, float* p, int n, float a, float m) {
  double total = 0;
  for (int b = 0; b < n; b += 256) {
    const int e = b + 256 < n ? b + 256 : n;
    float part = 0;
#pragma omp simd reduction(+ : part)
    for (int j = b; j < e; ++j) {
      p[j] = math::exp_approx(a * s[j] - m);
      part += p[j];
    }
    total += part;
  }
  return total;
}

STRATA_CLONES void scale_into(float* y, float a, int n) {
  for (int i = 0; i < n; ++i) y[i] *= a;
}

namespace {

// Rounding to each 16-bit type; the bodies below are written once over these and stamped
// out per type, each cloned per ISA.
struct Bf16 {
  static uint16_t round(float x) { return math::float_to_bf16(x); }
};
struct Fp16 {
  static uint16_t round(float x) { return math::float_to_fp16(x); }
};

template <class H>
STRATA_FORCE_INLINE void layernorm_rows_16_body(const float* x, const float* w, const float* b, uint16_t* y,
                                                float* mean, float* rstd, long r0, long r1, int n, float* row) {
  for (long r = r0; r < r1; ++r) {
    math::layernorm_row(x + r * n, w, b, row, n, mean + r, rstd + r);
    uint16_t* out = y + r * n;
#pragma omp simd
    for (int i = 0; i < n; ++i) out[i] = H::round(row[i]);
  }
}

template <class H>
STRATA_FORCE_INLINE void gelu_forward_16_body(const float* in, uint16_t* out, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) out[i] = H::round(math::gelu(in[i]));
}

template <class H>
STRATA_FORCE_INLINE void gelu_backward_16_body(const float* grad, const float* in, uint16_t* out, float* colsum,
                                               long rows, int n) {
  for (long r = 0; r < rows; ++r)
#pragma omp simd
    for (int j = 0; j < n; ++j) {
      const float g = grad[r * n + j] * math::gelu_grad(in[r * n + j]);
      out[r * n + j] = H::round(g);
      colsum[j] += g;
    }
}

template <class H>
STRATA_FORCE_INLINE void round_rows_16_body(const float* x, uint16_t* out, float* colsum, long rows, int n) {
  for (long r = 0; r < rows; ++r)
#pragma omp simd
    for (int j = 0; j < n; ++j) {
      out[r * n + j] = H::round(x[r * n + j]);
      colsum[j] += x[r * n + j];
    }
}

STRATA_CLONES void layernorm_rows_bf16(const float* x, const float* w, const float* b, uint16_t* y, float* mean,
                                       float* rstd, long r0, long r1, int n, float* row) {
  layernorm_rows_16_body<Bf16>(x, w, b, y, mean, rstd, r0, r1, n, row);
}
STRATA_CLONES void layernorm_rows_fp16(const float* x, const float* w, const float* b, uint16_t* y, float* mean,
                                       float* rstd, long r0, long r1, int n, float* row) {
  layernorm_rows_16_body<Fp16>(x, w, b, y, mean, rstd, r0, r1, n, row);
}
STRATA_CLONES void gelu_forward_bf16(const float* in, uint16_t* out, long n) { gelu_forward_16_body<Bf16>(in, out, n); }
STRATA_CLONES void gelu_forward_fp16(const float* in, uint16_t* out, long n) { gelu_forward_16_body<Fp16>(in, out, n); }
STRATA_CLONES void gelu_backward_bf16(const float* grad, const float* in, uint16_t* out, float* colsum, long rows,
                                      int n) {
  gelu_backward_16_body<Bf16>(grad, in, out, colsum, rows, n);
}
STRATA_CLONES void gelu_backward_fp16(const float* grad, const float* in, uint16_t* out, float* colsum, long rows,
                                      int n) {
  gelu_backward_16_body<Fp16>(grad, in, out, colsum, rows, n);
}
STRATA_CLONES void round_rows_bf16(const float* x, uint16_t* out, float* colsum, long rows, int n) {
  round_rows_16_body<Bf16>(x, out, colsum, rows, n);
}
STRATA_CLONES void round_rows_fp16(const float* x, uint16_t* out, float* colsum, long rows, int n) {
  round_rows_16_body<Fp16>(x, out, colsum, rows, n);
}

bool is_bf16(DType t) {
  STRATA_CHECK(t == DType::BF16 || t == DType::F16, std::string("not a 16-bit float type: ") + to_string(t));
  return t == DType::BF16;
}

}  // namespace

void layernorm_rows_16(const float* x, const float* w, const float* b, uint16_t* y, DType t, float* mean,
                       float* rstd, long r0, long r1, int n, float* row) {
  (is_bf16(t) ? layernorm_rows_bf16 : layernorm_rows_fp16)(x, w, b, y, mean, rstd, r0, r1, n, row);
}

void gelu_forward_16(const float* in, uint16_t* out, DType t, long n) {
  (is_bf16(t) ? gelu_forward_bf16 : gelu_forward_fp16)(in, out, n);
}

void gelu_backward_16(const float* grad, const float* in, uint16_t* out, DType t, float* colsum, long rows, int n) {
  (is_bf16(t) ? gelu_backward_bf16 : gelu_backward_fp16)(grad, in, out, colsum, rows, n);
}

void round_rows_16(const float* x, uint16_t* out, DType t, float* colsum, long rows, int n) {
  (is_bf16(t) ? round_rows_bf16 : round_rows_fp16)(x, out, colsum, rows, n);
}

}  // namespace strata::detail
