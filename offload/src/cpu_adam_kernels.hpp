// Private to cpu_adam*.cpp: the per-ISA kernels behind CpuAdam, and the scalar loop they
// share for tails. Each kernel updates elements [0, n) of the arrays it is given.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/adam.hpp"
#include "strata/core/math/half.hpp"

namespace strata::detail {

// What one step reads and writes. The step reads params_in, exp_avg_in and exp_avg_sq_in
// and writes params_out, exp_avg_out and exp_avg_sq_out: the same arrays for the in-place
// step, or arrays that do not overlap them (CpuAdam::step_into). Each element is read
// before it is written, so the kernels need no other care for the in-place case.
struct AdamArrays {
  const float* params_in;      // [n] fp32
  const void* grads;           // [n] of grad_type: fp32, or bf16 or fp16 bits
  DType grad_type;             // F32, BF16 or F16 (checked by CpuAdam::step_into)
  float grad_scale;            // each gradient is multiplied by this as it is read
  const float* exp_avg_in;     // [n] fp32
  const float* exp_avg_sq_in;  // [n] fp32
  float* params_out;           // [n] fp32
  float* exp_avg_out;          // [n] fp32
  float* exp_avg_sq_out;       // [n] fp32
  void* half_out;              // [n] bf16 or fp16 bits, or null when kind is None
  math::HalfKind kind;

  AdamArrays offset(size_t i) const {
    AdamArrays a = *this;
    a.params_in += i;
    a.grads = static_cast<const char*>(grads) + i * (grad_type == DType::F32 ? 4 : 2);
    a.exp_avg_in += i;
    a.exp_avg_sq_in += i;
    a.params_out += i;
    a.exp_avg_out += i;
    a.exp_avg_sq_out += i;
    if (half_out) a.half_out = static_cast<uint16_t*>(half_out) + i;
    return a;
  }
};

// prefetch: whether the vector kernels prefetch their input streams (CpuPrefetch::L1).
using AdamKernel = void (*)(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool prefetch);

// The element type of a gradient array: float, or the bits of a bf16 or fp16.
template <DType G>
using GradElement = std::conditional_t<G == DType::F32, float, uint16_t>;

// Calls fn(half kind, gradient type), each as a std::integral_constant, for the arrays'
// 16-bit output and gradient type: one instantiation of a kernel per pair, so that
// neither is branched on per element.
template <typename Fn>
void dispatch_adam(const AdamArrays& a, const Fn& fn) {
  auto with_grad = [&](auto kind) {
    switch (a.grad_type) {
      case DType::F32: return fn(kind, std::integral_constant<DType, DType::F32>{});
      case DType::BF16: return fn(kind, std::integral_constant<DType, DType::BF16>{});
      case DType::F16: return fn(kind, std::integral_constant<DType, DType::F16>{});
      default: fatal(__FILE__, __LINE__, "CpuAdam kernel entered with an unchecked gradient type");
    }
  };
  switch (a.kind) {
    case math::HalfKind::None: return with_grad(std::integral_constant<math::HalfKind, math::HalfKind::None>{});
    case math::HalfKind::Bf16: return with_grad(std::integral_constant<math::HalfKind, math::HalfKind::Bf16>{});
    case math::HalfKind::Fp16: return with_grad(std::integral_constant<math::HalfKind, math::HalfKind::Fp16>{});
  }
}

// When asked to (CpuPrefetch::L1), the vector kernels prefetch each input stream this
// many elements (1 KiB of an fp32 array) ahead, one cache line per 16 elements. The
// hardware prefetchers stop at 4 KiB page boundaries; on an Intel Xeon VM (2 cores, 4 KiB
// pages) this gave 5% with two threads and 9% with one, bringing the step to the speed of
// a kernel that moves the same bytes with no arithmetic; on an AMD EPYC VM it cost 13%
// (docs/bench-optimizer.md).
constexpr size_t kPrefetchAhead = 256;

// The vector kernels write the 16-bit copy with streaming (non-temporal) stores: it is
// the one array the step writes without reading, so a plain store would first read each
// of its lines from memory (2 more bytes per parameter) and leave them in the caches, where
// nothing here wants them. Those stores need aligned addresses: the number of elements
// (under n) the scalar loop takes first so that half + i is `align`-byte aligned; 0 with no
// copy. The in-place arrays keep plain stores: their lines were just read, so there is no
// read to save (streaming them was 12-14% slower, docs/bench-optimizer.md).
inline size_t half_copy_head(const uint16_t* half, size_t align, size_t n) {
  if (!half) return 0;
  const size_t past = reinterpret_cast<uintptr_t>(half) % align;  // bytes past the boundary; even
  return past ? std::min(n, (align - past) / 2) : 0;
}

// Gradient element i, widened to fp32 (exactly) and scaled.
template <DType G>
STRATA_FORCE_INLINE float scaled_grad(const AdamArrays& a, size_t i) {
  const GradElement<G> x = static_cast<const GradElement<G>*>(a.grads)[i];
  float g;
  if constexpr (G == DType::F32) g = x;
  else if constexpr (G == DType::BF16) g = math::bf16_to_float(x);
  else g = math::fp16_to_float(x);
  return math::adam_scaled_grad(g, a.grad_scale);
}

// Elements [begin, end) with the shared per-element function. Always inlined, so that
// each ISA's file compiles its own copy with its own flags (fma is one instruction there,
// a libm call in the baseline build; the bits are the same) and the linker cannot hand a
// baseline caller the AVX-512 copy.
template <math::HalfKind Kind, DType G>
STRATA_FORCE_INLINE void adam_scalar_range(const math::AdamStepScalars& s, const AdamArrays& a, size_t begin,
                                           size_t end) {
  uint16_t* half = static_cast<uint16_t*>(a.half_out);
  for (size_t i = begin; i < end; ++i) {
    float p = a.params_in[i];
    float m = a.exp_avg_in[i];
    float v = a.exp_avg_sq_in[i];
    math::adam_update(s, p, scaled_grad<G>(a, i), m, v);
    a.params_out[i] = p;
    a.exp_avg_out[i] = m;
    a.exp_avg_sq_out[i] = v;
    if constexpr (Kind == math::HalfKind::Bf16) half[i] = math::float_to_bf16(p);
    if constexpr (Kind == math::HalfKind::Fp16) half[i] = math::float_to_fp16(p);
  }
}

void adam_kernel_scalar(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool prefetch);
#if defined(__x86_64__)
void adam_kernel_avx2(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool prefetch);  // cpu_adam_avx2.cpp
void adam_kernel_avx512(const math::AdamStepScalars& s, const AdamArrays& a, size_t n,
                        bool prefetch);  // cpu_adam_avx512.cpp
#endif

}  // namespace strata::detail
