// Element-wise math of the GPT, written once for host and device code (DESIGN.md,
// "Backends"): GELU (GPT-2's tanh approximation) and layer normalisation of one row,
// forward and backward. The cpu backend's model calls these; the cuda kernels call the
// same functions, so the CPU tests check the math the GPU runs.
#pragma once

#include <cmath>

#include "strata/core/math/host_device.hpp"

namespace strata::math {

constexpr float kLayerNormEps = 1e-5f;  // torch.nn.LayerNorm's default, as GPT-2 uses

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (torch GELU(approximate="tanh"))
STRATA_HD STRATA_FORCE_INLINE float gelu(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  const float u = k * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx
STRATA_HD STRATA_FORCE_INLINE float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  const float u = k * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// y = (x - mean) * rstd * w + b over one row of n; returns mean and rstd for backward.
STRATA_HD STRATA_FORCE_INLINE void layernorm_row(const float* x, const float* w, const float* b, float* y, int n,
                                                 float* mean_out, float* rstd_out) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m += x[i];
  m /= static_cast<float>(n);
  float v = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float c = x[i] - m;
    v += c * c;
  }
  v /= static_cast<float>(n);
  const float r = 1.0f / sqrtf(v + kLayerNormEps);
  for (int i = 0; i < n; ++i) y[i] = (x[i] - m) * r * w[i] + b[i];
  *mean_out = m;
  *rstd_out = r;
}

// Backward of layernorm_row: dx += (accumulates into the residual gradient), and the
// row's contribution to dw, db is added to dw, db.
STRATA_HD STRATA_FORCE_INLINE void layernorm_row_backward(const float* dy, const float* x, const float* w, float mean,
                                                          float rstd, int n, float* dx, float* dw, float* db) {
  float sum_g = 0.0f, sum_gx = 0.0f;  // sums of g = dy*w and g*xhat
  for (int i = 0; i < n; ++i) {
    const float xh = (x[i] - mean) * rstd;
    const float g = dy[i] * w[i];
    sum_g += g;
    sum_gx += g * xh;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int i = 0; i < n; ++i) {
    const float xh = (x[i] - mean) * rstd;
    const float g = dy[i] * w[i];
    dx[i] += rstd * (g - inv_n * sum_g - xh * inv_n * sum_gx);
    dw[i] += dy[i] * xh;
    db[i] += dy[i];
  }
}

}  // namespace strata::math
