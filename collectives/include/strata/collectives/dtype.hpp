// Element types a collective can carry, and the map from C++ types to them.
//
// Collectives take typed views (communicator.hpp) whose element type fixes both the
// count and the datatype, so bytes and elements cannot be confused.
// 16-bit floats need care: raw uint16_t storage says nothing about whether the bits are
// bf16 or fp16, and summing them as integers would be silently wrong. So uint16_t has
// no datatype; 16-bit floats travel as the tag types Bf16 and Fp16 (two bytes of
// storage each), which every backend can sum and max (NCCL natively, MPI through a
// user-defined operation that widens to float per element).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/core/dtype.hpp"
#include "strata/core/math/half.hpp"

namespace strata::coll {

using DataType = strata::DType;  // one element-type enum for the runtime (core/dtype.hpp)

inline size_t size_of(DataType t) { return dtype_size(t); }  // bytes per element
using strata::to_string;  // "float", "bf16", ...

// bfloat16 storage: the upper half of an IEEE float.
struct Bf16 {
  uint16_t bits;
  friend bool operator==(Bf16, Bf16) = default;
};
// IEEE binary16 storage.
struct Fp16 {
  uint16_t bits;
  friend bool operator==(Fp16, Fp16) = default;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

// Conversions, round to nearest even; NaN stays NaN, overflow goes to infinity. The
// same functions as the CPU optimizer's and the GPU's (core/math/half.hpp).
inline float to_float(Bf16 h) { return math::bf16_to_float(h.bits); }
inline Bf16 to_bf16(float f) { return Bf16{math::float_to_bf16(f)}; }
inline float to_float(Fp16 h) { return math::fp16_to_float(h.bits); }
inline Fp16 to_fp16(float f) { return Fp16{math::float_to_fp16(f)}; }

// dtype_of<T>::value: the DataType of T. Only the types below have one; a type from
// another part of Strata (a model's bf16, say) may add a specialization here.
template <class T>
struct dtype_of;
template <> struct dtype_of<uint8_t> { static constexpr DataType value = DataType::U8; };
template <> struct dtype_of<std::byte> { static constexpr DataType value = DataType::U8; };
template <> struct dtype_of<int32_t> { static constexpr DataType value = DataType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DataType value = DataType::I64; };
template <> struct dtype_of<Fp16> { static constexpr DataType value = DataType::F16; };
template <> struct dtype_of<Bf16> { static constexpr DataType value = DataType::BF16; };
template <> struct dtype_of<float> { static constexpr DataType value = DataType::F32; };
template <> struct dtype_of<double> { static constexpr DataType value = DataType::F64; };

// A type a collective can carry. uint16_t is deliberately not one (see the top).
template <class T>
concept Element = requires { dtype_of<std::remove_cv_t<T>>::value; };

template <Element T>
inline constexpr DataType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

}  // namespace strata::coll
