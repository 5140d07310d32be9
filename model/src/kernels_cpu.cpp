#include "kernels_cpu.hpp"

#include "strata/core/math/gpt.hpp"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define STRATA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_CLONES
#endif

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

STRATA_CLONES float max_of(const float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

STRATA_CLONES double exp_shifted(const float* s, float* p, int n, float m) {
  // Blocks of 256 summed in float (vectorised), blocks added in double.
  double total = 0;
  for (int b = 0; b < n; b += 256) {
    const int e = b + 256 < n ? b + 256 : n;
    float part = 0;
#pragma omp simd reduction(+ : part)
    for (int j = b; j < e; ++j) {
      p[j] = math::exp_approx(s[j] - m);
      part += p[j];
    }
    total += part;
  }
  return total;
}

STRATA_CLONES void scale_into(float* y, float a, int n) {
  for (int i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace strata::detail
