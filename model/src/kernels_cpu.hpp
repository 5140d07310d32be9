// The cpu backend's element-wise kernels of the GPT, over ranges. Each is compiled for
// AVX-512, AVX2 and baseline x86-64 and the best one for the running CPU is picked at
// load time (GCC target_clones), so one binary runs everywhere at full vector width.
// The math itself is core/math/gpt.hpp, shared with the GPU.
#pragma once

#include <cstdint>

#include "strata/core/dtype.hpp"

namespace strata::detail {

void gelu_forward(const float* in, float* out, long n);               // out = gelu(in)
void gelu_backward(float* grad, const float* in, long n);             // grad *= gelu'(in)
void add_bias_rows(float* y, const float* bias, long rows, int n);    // y[r] += bias
void add_into(float* y, const float* x, long n);                      // y += x
void layernorm_rows(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, long r0,
                    long r1, int n);
void layernorm_backward_rows(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                             float* dx, float* dw, float* db, long r0, long r1, int n);
// Llama's RMSNorm over rows [r0, r1) (fp32 out), and its backward (dx +=, dw +=).
void rmsnorm_rows(const float* x, const float* w, float* y, float* rstd, long r0, long r1, int n, float eps);
void rmsnorm_backward_rows(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                           long r0, long r1, int n);
// SwiGLU over rows of gu = [gate (f), up (f)]: out[r] = silu(gate) * up (rows x f), and
// its backward from dout: dgu[r] = [dout * up * silu'(gate), dout * silu(gate)].
void swiglu_forward(const float* gu, float* out, long rows, int f);
void swiglu_backward(const float* dout, const float* gu, float* dgu, long rows, int f);
float max_of(const float* x, int n);
// p[j] = exp(s[j] - m) for j < n; returns the sum (in double for long rows).
double exp_shifted(const float* s, float* p, int n, float m);
// p[j] = exp(a s[j] - m) for j < n (a s[j] rounded to fp32 first); returns the sum as above.
double exp_scaled(const float* s, float* p, int n, float a, float m);
void scale_into(float* y, float a, int n);                            // y *= a

// The 16-bit model's producers of matmul operands (docs/mixed-precision.md): fp32 math,
// the output rounded once to t (BF16 or F16), in the same pass that computes it.
// Rows [r0, r1) of layernorm_rows, the output rounded; row: n floats of scratch.
void layernorm_rows_16(const float* x, const float* w, const float* b, uint16_t* y, DType t, float* mean,
                       float* rstd, long r0, long r1, int n, float* row);
void gelu_forward_16(const float* in, uint16_t* out, DType t, long n);  // out = round(gelu(in))
// Over [rows, n]: g = grad * gelu'(in); out = round(g); colsum[j] += sum over rows of g.
void gelu_backward_16(const float* grad, const float* in, uint16_t* out, DType t, float* colsum, long rows, int n);
// Over [rows, n]: out = round(x); colsum[j] += sum over rows of x.
void round_rows_16(const float* x, uint16_t* out, DType t, float* colsum, long rows, int n);

}  // namespace strata::detail
