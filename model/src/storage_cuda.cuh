// Element types of the cuda GPT's buffers, for kernels templated on them: weights,
// gradients and the 16-bit activations (docs/mixed-precision.md) are stored as F32, BF16
// or F16 and computed on as fp32 in registers. 16-bit values travel as their bits;
// load/store are core/math/half.hpp's conversions (round to nearest even), bit for bit
// the host's, so a value the GPU rounds is the value the cpu model rounds from the same
// fp32 input. (core/src/cuda_device.cu has the same three tags for the stream's typed ops;
// the two live in different libraries' private sources.)
//
// CUDA sources only (C++17).
#pragma once

#include <cstdint>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/half.hpp"

namespace strata::detail::cuda {

struct F32S {
  using Bits = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
struct Bf16S {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(uint16_t v) { return math::bf16_to_float(v); }
  static __device__ __forceinline__ uint16_t store(float v) { return math::float_to_bf16(v); }
};
struct Fp16S {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(uint16_t v) { return math::fp16_to_float(v); }
  static __device__ __forceinline__ uint16_t store(float v) { return math::float_to_fp16(v); }
};

// Calls f(S{}) with S the storage tag of t; any other type is a caller's bug.
template <class F>
void with_storage(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(F32S{}); return;
    case DType::BF16: f(Bf16S{}); return;
    case DType::F16: f(Fp16S{}); return;
    default: break;
  }
  throw Error(std::string("cuda GPT kernels: element type ") + to_string(t) + " is not f32, bf16 or fp16");
}

// The launchers' untyped pointers as S's bits.
template <class S>
const typename S::Bits* as(const void* p) {
  return static_cast<const typename S::Bits*>(p);
}
template <class S>
typename S::Bits* as(void* p) {
  return static_cast<typename S::Bits*>(p);
}

}  // namespace strata::detail::cuda
