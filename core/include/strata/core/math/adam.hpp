// The Adam/AdamW update of one element, written once for host and device code
// (shared by the cpu and cuda backends, so the CPU tests check the math the GPU runs).
//
// The order of operations, and which of them are fused multiply-adds, is the one
// PyTorch's CPU kernels use for torch.optim.Adam / AdamW (foreach=False, 1.13) when
// they run their AVX2/AVX-512 code:
//
//   AdamW:  p = p * (1 - lr*wd)                      param.mul_(1 - lr * weight_decay)
//   Adam:   g = fma(p, wd, g)                        grad.add(param, alpha=weight_decay)
//           m = fma(g, 1 - b1, m * b1)               exp_avg.mul_(b1).add_(grad, alpha=1 - b1)
//           v = fma((1 - b2) * g, g, v * b2)         exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
//           d = sqrt(v) / sqrt(1 - b2^t) + eps       (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//           p = p + (-lr / (1 - b1^t) * m) / d       param.addcdiv_(exp_avg, denom, value=-step_size)
//
// The per-step scalars are computed in double, as torch computes them from Python
// floats, and rounded to float once. Every SIMD kernel follows the same sequence, so the
// scalar function below is bit-identical to them; that holds only where the compiler
// does not contract a*b+c on its own: host files including this header for numerics
// are built with -ffp-contract=off, and device code uses the _rn intrinsics below.
#pragma once

#include <cmath>
#include <cstdint>

#include "strata/core/math/host_device.hpp"

namespace strata::math {

// Adam adds the weight decay to the gradient (L2 regularisation, torch.optim.Adam);
// AdamW decays the weights directly (decoupled, torch.optim.AdamW).
enum class AdamVariant { Adam, AdamW };

// Hyperparameters, in double like the Python floats torch is given, so that the
// per-step scalars below round exactly as torch's do.
struct AdamHyperparams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  AdamVariant variant = AdamVariant::AdamW;
};

// The scalars one step needs, already rounded to float.
struct AdamStepScalars {
  float beta1;
  float one_minus_beta1;        // float(1 - beta1), the subtraction done in double
  float beta2;
  float one_minus_beta2;
  float neg_step_size;          // -lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float grad_decay;             // Adam: weight_decay, added to the gradient; AdamW: 0
  float param_decay;            // AdamW: 1 - lr * weight_decay; Adam: 1
};

// Host only: computed once per step (t >= 1, the step being taken, counted from 1 as
// torch's state['step'] is after its increment).
inline AdamStepScalars adam_step_scalars(const AdamHyperparams& h, int64_t t) {
  const double step = static_cast<double>(t);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
  const bool adamw = h.variant == AdamVariant::AdamW;
  AdamStepScalars s;
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(h.eps);
  s.grad_decay = adamw ? 0.0f : static_cast<float>(h.weight_decay);
  s.param_decay = adamw ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  return s;
}

namespace detail {
// Correctly rounded float operations that no compiler may fuse or approximate.
STRATA_HD STRATA_FORCE_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HD STRATA_FORCE_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HD STRATA_FORCE_INLINE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_HD STRATA_FORCE_INLINE float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
STRATA_HD STRATA_FORCE_INLINE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
}  // namespace detail

// The gradient as the update reads it: the stored gradient widened to fp32 (exact from
// bf16 or fp16) times the caller's scale (averaging over ranks and micro-steps, clipping,
// the inverse of the fp16 loss scale), one rounding. A scale of 1 leaves g unchanged.
STRATA_HD STRATA_FORCE_INLINE float adam_scaled_grad(float g, float scale) { return detail::mul_rn(g, scale); }

// One element of one step. p, m, v are the fp32 master weight and moments, updated in
// place; g is the fp32 gradient, already scaled (adam_scaled_grad).
STRATA_HD STRATA_FORCE_INLINE void adam_update(const AdamStepScalars& s, float& p, float g, float& m, float& v) {
  using namespace detail;
  p = mul_rn(p, s.param_decay);
  g = fma_rn(p, s.grad_decay, g);
  m = fma_rn(g, s.one_minus_beta1, mul_rn(m, s.beta1));
  v = fma_rn(mul_rn(s.one_minus_beta2, g), g, mul_rn(v, s.beta2));
  const float denom = add_rn(div_rn(sqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = add_rn(p, div_rn(mul_rn(s.neg_step_size, m), denom));
}

}  // namespace strata::math
