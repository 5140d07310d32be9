#include "strata/core/math/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/convert.hpp"

namespace strata::math {

double QuantizeError::relative() const { return value_sq > 0 ? std::sqrt(error_sq / value_sq) : 0.0; }

QuantizeError quantize_int8(const void* src, DType t, size_t n, size_t block, uint8_t* out, NonFinite non_finite) {
  if (block == 0) throw std::invalid_argument("quantize_int8: a block of 0 elements");
  const size_t blocks = (n + block - 1) / block;
  auto* q = reinterpret_cast<int8_t*>(out);
  uint8_t* scales = out + n;
  std::vector<float> v(std::min(block, n));
  QuantizeError e;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * block, m = std::min(block, n - first);
    convert_to_f32(v.data(), static_cast<const std::byte*>(src) + first * dtype_size(t), t, m);
    float amax = 0;
    bool finite = true;
    for (size_t i = 0; i < m; ++i) {
      if (!std::isfinite(v[i])) {
        if (non_finite == NonFinite::Refuse)
          throw std::invalid_argument("quantize_int8: element " + std::to_string(first + i) + " is not finite");
        finite = false;
      }
      amax = std::max(amax, std::fabs(v[i]));
    }
    if (!finite) {  // NonFinite::Propagate: the whole block dequantizes to NaN
      std::memset(q + first, 0, m);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(scales + 4 * b, &nan, 4);
      continue;
    }
    const float scale = amax > 0 ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / scale;
    for (size_t i = 0; i < m; ++i) {
      const float r = std::nearbyint(v[i] * inv);
      const auto k = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      q[first + i] = k;
      const double d = double(k) * scale - double(v[i]);
      e.error_sq += d * d;
      e.value_sq += double(v[i]) * double(v[i]);
    }
    std::memcpy(scales + 4 * b, &scale, 4);
  }
  return e;
}

void dequantize_int8(const uint8_t* in, size_t n, size_t block, void* dst, DType t) {
  if (block == 0) throw std::invalid_argument("dequantize_int8: a block of 0 elements");
  const size_t blocks = (n + block - 1) / block;
  const auto* q = reinterpret_cast<const int8_t*>(in);
  const uint8_t* scales = in + n;
  std::vector<float> v(std::min(block, n));
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * block, m = std::min(block, n - first);
    float scale;
    std::memcpy(&scale, scales + 4 * b, 4);
    for (size_t i = 0; i < m; ++i) v[i] = float(q[first + i]) * scale;
    convert_from_f32(static_cast<std::byte*>(dst) + first * dtype_size(t), t, v.data(), m);
  }
}

void dequantize_add_int8(const uint8_t* in, size_t n, size_t block, float* acc) {
  if (block == 0) throw std::invalid_argument("dequantize_add_int8: a block of 0 elements");
  const size_t blocks = (n + block - 1) / block;
  const auto* q = reinterpret_cast<const int8_t*>(in);
  const uint8_t* scales = in + n;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * block, m = std::min(block, n - first);
    float scale;
    std::memcpy(&scale, scales + 4 * b, 4);
    for (size_t i = 0; i < m; ++i) acc[first + i] += float(q[first + i]) * scale;
  }
}

}  // namespace strata::math
