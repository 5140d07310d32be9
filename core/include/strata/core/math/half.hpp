// fp32 <-> bf16 and fp32 <-> fp16 (IEEE binary16) conversions, round-to-nearest-even,
// for host and device code. 16-bit values travel as their bits (uint16_t) so that the
// same code compiles everywhere without a half type.
//
// The float -> 16-bit functions give the same bits as the x86 vector instructions the
// CPU optimizer uses (VCVTPS2PH for fp16; the integer rounding sequence for bf16),
// including subnormals, overflow to infinity, and NaN, which stays NaN with its sign and
// the top of its payload, quietened.
#pragma once

#include <cstdint>
#include <cstring>

#include "strata/core/math/host_device.hpp"

namespace strata::math {

enum class HalfKind { None, Bf16, Fp16 };

namespace detail {
STRATA_HD STRATA_FORCE_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
STRATA_HD STRATA_FORCE_INLINE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

STRATA_HD STRATA_FORCE_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t u = detail::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry
  // into the exponent is the correct rounding up (to infinity past the largest bf16).
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

STRATA_HD STRATA_FORCE_INLINE float bf16_to_float(uint16_t h) { return detail::bits_float(static_cast<uint32_t>(h) << 16); }

STRATA_HD STRATA_FORCE_INLINE uint16_t float_to_fp16(float f) {
  const uint32_t u = detail::float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));  // NaN
  // 0x477FF000 is 65520, halfway between the largest fp16 (65504) and 2^16: it and
  // everything above round to infinity.
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // a normal fp16 (>= 2^-14): rebias the exponent, round 13 bits
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  // A subnormal fp16 (or zero): the result is round(|f| / 2^-24). At most 2^-25 (the tie
  // with zero included) rounds to zero; this also covers fp32 subnormals.
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);
  const uint32_t exponent = a >> 23;  // 102 .. 112
  const uint32_t mantissa = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - exponent;  // 14 .. 24
  uint32_t q = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<uint16_t>(sign | q);
}

STRATA_HD STRATA_FORCE_INLINE float fp16_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x03FFu;
  if (exponent == 0x1Fu) return detail::bits_float(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return detail::bits_float(sign);
  // Subnormal: normalise. The value is mantissa * 2^-24.
  int e = 113;  // 127 - 14
  while ((mantissa & 0x0400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return detail::bits_float(sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x03FFu) << 13));
}

}  // namespace strata::math
