// The cpu backend's element-wise kernels of the GPT, over ranges. Each is compiled for
// AVX-512, AVX2 and baseline x86-64 and the best one for the running CPU is picked at
// load time (GCC target_clones), so one binary runs everywhere at full vector width.
// The math itself is core/math/gpt.hpp, shared with the GPU.
#pragma once

namespace strata::detail {

void gelu_forward(const float* in, float* out, long n);               // out = gelu(in)
void gelu_backward(float* grad, const float* in, long n);             // grad *= gelu'(in)
void add_bias_rows(float* y, const float* bias, long rows, int n);    // y[r] += bias
void add_into(float* y, const float* x, long n);                      // y += x
void layernorm_rows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, long r0,
                    long r1, int n);
void layernorm_backward_rows(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                             float* dx, float* dw, float* db, long r0, long r1, int n);
float max_of(const float* x, int n);
// p[j] = exp(s[j] - m) for j < n; returns the sum (in double for long rows).
double exp_shifted(const float* s, float* p, int n, float m);
void scale_into(float* y, float a, int n);                            // y *= a

}  // namespace strata::detail
