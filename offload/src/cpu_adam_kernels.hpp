// Private to cpu_adam*.cpp: the per-ISA kernels behind CpuAdam, and the scalar loop they
// share for tails. Each kernel updates elements [0, n) of the arrays it is given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/math/adam.hpp"
#include "strata/core/math/half.hpp"

namespace strata::detail {

struct AdamArrays {
  float* params;        // [n] fp32, updated in place
  const float* grads;   // [n] fp32
  float* exp_avg;       // [n] fp32, updated in place
  float* exp_avg_sq;    // [n] fp32, updated in place
  void* half_out;       // [n] bf16 or fp16 bits, or null when kind is None
  math::HalfKind kind;

  AdamArrays offset(size_t i) const {
    AdamArrays a = *this;
    a.params += i;
    a.grads += i;
    a.exp_avg += i;
    a.exp_avg_sq += i;
    if (half_out) a.half_out = static_cast<uint16_t*>(half_out) + i;
    return a;
  }
};

using AdamKernel = void (*)(const math::AdamStepScalars& s, const AdamArrays& a, size_t n);

// The vector kernels prefetch each input stream this many elements (1 KiB) ahead, one
// cache line per 16 elements. The hardware prefetchers stop at 4 KiB page boundaries;
// on the development machine (Xeon, 2 cores, 4 KiB pages) this gave 5% with two
// threads and 9% with one, bringing the step to the speed of a kernel that moves the
// same bytes with no arithmetic (docs/bench-optimizer.md).
constexpr size_t kPrefetchAhead = 256;

// Elements [begin, end) with the shared per-element function. Always inlined, so that
// each ISA's file compiles its own copy with its own flags (fma is one instruction there,
// a libm call in the baseline build; the bits are the same) and the linker cannot hand a
// baseline caller the AVX-512 copy.
STRATA_FORCE_INLINE void adam_scalar_range(const math::AdamStepScalars& s, const AdamArrays& a, size_t begin,
                              size_t end) {
  uint16_t* half = static_cast<uint16_t*>(a.half_out);
  for (size_t i = begin; i < end; ++i) {
    float p = a.params[i];
    float m = a.exp_avg[i];
    float v = a.exp_avg_sq[i];
    math::adam_update(s, p, a.grads[i], m, v);
    a.params[i] = p;
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    if (a.kind == math::HalfKind::Bf16) half[i] = math::float_to_bf16(p);
    if (a.kind == math::HalfKind::Fp16) half[i] = math::float_to_fp16(p);
  }
}

void adam_kernel_scalar(const math::AdamStepScalars& s, const AdamArrays& a, size_t n);
#if defined(__x86_64__)
void adam_kernel_avx2(const math::AdamStepScalars& s, const AdamArrays& a, size_t n);    // cpu_adam_avx2.cpp
void adam_kernel_avx512(const math::AdamStepScalars& s, const AdamArrays& a, size_t n);  // cpu_adam_avx512.cpp
#endif

}  // namespace strata::detail
