// Element types a collective can carry, and the map from C++ types to them.
//
// Collectives take typed views (communicator.hpp) whose element type fixes both the
// count and the datatype, so bytes and elements cannot be confused (STYLE.md, habit 4).
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

namespace strata::coll {

enum class DataType : uint8_t {
  U8,    // uint8_t, std::byte
  I32,   // int32_t
  I64,   // int64_t
  F16,   // Fp16 (IEEE binary16)
  BF16,  // Bf16 (bfloat16)
  F32,   // float
  F64,   // double
};

size_t size_of(DataType t);  // bytes per element
const char* to_string(DataType t);  // "float", "bf16", ...

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

// Conversions, round to nearest even; NaN stays NaN, overflow goes to infinity.
inline float to_float(Bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }
inline Bf16 to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((x >> 16) | 0x40u)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(x >> 16)};
}
inline float to_float(Fp16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}
inline Fp16 to_fp16(float f) {
  // After F. Giesen's float_to_half_fast3_rtne (public domain).
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t o;
  if (x >= (127u + 16u) << 23) {  // >= 65536, Inf or NaN
    o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 113u << 23) {  // result is subnormal or zero: let float addition round
    const float magic = 0.5f;   // 2^-1: aligns the 10 mantissa bits at the bottom
    o = std::bit_cast<uint32_t>(std::bit_cast<float>(x) + magic) - std::bit_cast<uint32_t>(magic);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;
    o = x >> 13;
  }
  return Fp16{static_cast<uint16_t>(o | (sign >> 16))};
}

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
