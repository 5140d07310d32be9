// Element-wise math of the GPT, written once for host and device code: GELU (GPT-2's
// tanh approximation) and layer normalisation of one row, forward and backward; Llama's
// RMSNorm and SiLU. The cpu backend's model calls these; the cuda kernels call the same
// functions, so the CPU tests check the math the GPU runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/core/math/host_device.hpp"

namespace strata::math {

constexpr float kLayerNormEps = 1e-5f;  // torch.nn.LayerNorm's default, as GPT-2 uses

// exp(x) for float, within 2 ulp (Cephes' expf: range reduction by ln 2, degree-5
// polynomial, exponent by bit assembly). Unlike libm's expf it has no branches or calls,
// so loops over it vectorise; the same code runs on the GPU. x is clamped to
// [-87, 88] (results from 1.6e-38 to 1.65e38).
STRATA_HD STRATA_FORCE_INLINE float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;  // two selects: a nested one does not if-convert
  x = x > 88.0f ? 88.0f : x;
  // k = floor(t) by truncation and a correction (floorf does not vectorise without
  // -fno-trapping-math); t lies in [-125, 128] here.
  const float t = x * 1.44269504088896341f + 0.5f;
  const int32_t ki = static_cast<int32_t>(t) - (t < static_cast<float>(static_cast<int32_t>(t)) ? 1 : 0);
  const float k = static_cast<float>(ki);
  float r = x - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (ki + 127) << 23;
#if defined(__CUDA_ARCH__)
  return p * __int_as_float(bits);
#elif defined(__CUDACC__)
  float scale;  // nvcc's host pass
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
#else
  return p * __builtin_bit_cast(float, bits);  // a register move: the loop stays vectorised
#endif
}

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)  (torch GELU(approximate="tanh")),
// computed as x * sigmoid(2u), the same function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)).
STRATA_HD STRATA_FORCE_INLINE float gelu(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  const float u = k * (x + 0.044715f * x * x * x);
  return x / (1.0f + exp_approx(-2.0f * u));
}

// d gelu / dx = s + x * 2 s (1 - s) du/dx, s = sigmoid(2u)  (as 0.5 (1 - tanh^2) = 2 s (1 - s))
STRATA_HD STRATA_FORCE_INLINE float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  const float u = k * (x + 0.044715f * x * x * x);
  const float s = 1.0f / (1.0f + exp_approx(-2.0f * u));
  const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
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

// silu(x) = x sigmoid(x) (torch.nn.functional.silu), and its derivative
// s (1 + x (1 - s)), s = sigmoid(x).
STRATA_HD STRATA_FORCE_INLINE float silu(float x) { return x / (1.0f + exp_approx(-x)); }
STRATA_HD STRATA_FORCE_INLINE float silu_grad(float x) {
  const float s = 1.0f / (1.0f + exp_approx(-x));
  return s * (1.0f + x * (1.0f - s));
}

// y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) over one row of n (Hugging Face's
// LlamaRMSNorm in fp32); returns rstd for backward.
STRATA_HD STRATA_FORCE_INLINE void rmsnorm_row(const float* x, const float* w, float* y, int n, float eps,
                                               float* rstd_out) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
  *rstd_out = r;
}

// Backward of rmsnorm_row: dx += r (g - xhat mean(g xhat)), g = dy w, xhat = x r; the
// row's dw (dy xhat) is added to dw.
STRATA_HD STRATA_FORCE_INLINE void rmsnorm_row_backward(const float* dy, const float* x, const float* w, float rstd,
                                                        int n, float* dx, float* dw) {
  float sum_gx = 0.0f;
  for (int i = 0; i < n; ++i) sum_gx += dy[i] * w[i] * (x[i] * rstd);
  const float m = sum_gx / static_cast<float>(n);
  for (int i = 0; i < n; ++i) {
    const float xh = x[i] * rstd;
    dx[i] += rstd * (dy[i] * w[i] - xh * m);
    dw[i] += dy[i] * xh;
  }
}

}  // namespace strata::math
