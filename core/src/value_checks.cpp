#include "strata/core/value_checks.hpp"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace {

// The smallest magnitude that rounds to inf in t (round to nearest even): half an ulp
// above the largest finite value, where the tie goes up because that value's mantissa
// is odd (all ones). F16: 65520; BF16: the fp32 bits 0x7f7f8000. F32: none.
float overflow_threshold(DType t) {
  switch (t) {
    case DType::F16: return 65520.0f;
    case DType::BF16: return std::bit_cast<float>(uint32_t{0x7f7f8000u});
    default: return INFINITY;
  }
}

bool beyond(float x, float threshold) { return std::isfinite(x) && std::fabs(x) >= threshold; }

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

double largest_finite(DType t) {
  switch (t) {
    case DType::F16: return 65504.0;
    case DType::BF16: return static_cast<double>(std::bit_cast<float>(uint32_t{0x7f7f0000u}));
    default: return FLT_MAX;
  }
}

uint64_t check_range(float* x, size_t n, DType t, OutOfRange mode, const std::string& what, const std::string& fix,
                     uint64_t first_index) {
  const float threshold = overflow_threshold(t);
  if (std::isinf(threshold)) return 0;
  uint64_t count = 0;
  size_t worst = 0;
  for (size_t i = 0; i < n; ++i)
    if (beyond(x[i], threshold)) {
      if (count == 0 || std::fabs(x[i]) > std::fabs(x[worst])) worst = i;
      ++count;
    }
  if (count == 0) return 0;
  const std::string name = precision_name(t);
  if (mode == OutOfRange::Refuse)
    throw ConfigError(what + " holds " + std::to_string(count) + " value(s) beyond " + name +
                      "'s range, the largest in magnitude " + number(x[worst]) + " at flat index " +
                      std::to_string(first_index + worst) + ", above " + name + "'s largest finite value " +
                      number(largest_finite(t)) + " (in " + name + " it would be " + (x[worst] < 0 ? "-inf" : "inf") +
                      "); " + fix);
  const float limit = static_cast<float>(largest_finite(t));
  for (size_t i = 0; i < n; ++i)
    if (beyond(x[i], threshold)) x[i] = std::copysign(limit, x[i]);
  return count;
}

void narrow_from_f32(void* dst, DType t, const float* src, size_t n, OutOfRange mode, const std::string& what,
                     const std::string& fix) {
  const float threshold = overflow_threshold(t);
  bool any = false;
  for (size_t i = 0; i < n && !any; ++i) any = beyond(src[i], threshold);
  if (!any) return convert_from_f32(dst, t, src, n);
  std::vector<float> copy(src, src + n);
  check_range(copy.data(), n, t, mode, what, fix);
  convert_from_f32(dst, t, copy.data(), n);
}

void check_finite(const float* x, size_t n, const std::string& what, const std::string& fix, uint64_t first_index) {
  size_t first = n;
  uint64_t count = 0;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) {
      if (first == n) first = i;
      ++count;
    }
  if (count == 0) return;
  throw ConfigError(what + " holds " + std::to_string(count) + " non-finite value(s), the first " +
                    number(x[first]) + " at flat index " + std::to_string(first_index + first) + "; " + fix);
}

}  // namespace strata
