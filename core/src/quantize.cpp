#include "strata/core/math/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/target_clones.hpp"

namespace strata::math {

namespace {

// Sums and maxima in kLanes partial results, so the loops vectorise without reordering
// permission (no -ffast-math): lane j takes elements j, j + kLanes, ...
constexpr size_t kLanes = 16;

// One block's largest magnitude, and whether every value is finite (x * 0 is NaN for an
// infinity or a NaN, and the sum keeps it).
STRATA_CLONES float block_amax(const float* v, size_t m, bool* finite) {
  float amax[kLanes] = {}, probe[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= m; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const float a = std::fabs(v[i + j]);
      amax[j] = a > amax[j] ? a : amax[j];
      probe[j] += v[i + j] * 0.0f;
    }
  for (size_t j = 0; i + j < m; ++j) {
    const float a = std::fabs(v[i + j]);
    amax[j] = a > amax[j] ? a : amax[j];
    probe[j] += v[i + j] * 0.0f;
  }
  float a = 0, p = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    a = amax[j] > a ? amax[j] : a;
    p += probe[j];
  }
  *finite = p == 0.0f;
  return a;
}

// Rounds v * inv to nearest even (adding and taking away 1.5 x 2^23 leaves an integer
// for |x| < 2^22; here |x| <= 127), stores it as int8, and sums the squared rounding
// error and values in fp32 (a block of at most a few thousand terms).
STRATA_CLONES void quantize_block(const float* v, size_t m, float inv, float scale, int8_t* q, float* err_sq,
                                  float* val_sq) {
  constexpr float kRound = 12582912.0f;
  float e[kLanes] = {}, s[kLanes] = {};
  auto one = [&](size_t i, size_t j) {
    float r = (v[i] * inv + kRound) - kRound;
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    q[i] = static_cast<int8_t>(r);
    const float d = r * scale - v[i];
    e[j] += d * d;
    s[j] += v[i] * v[i];
  };
  size_t i = 0;
  for (; i + kLanes <= m; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) one(i + j, j);
  for (size_t j = 0; i + j < m; ++j) one(i + j, j);
  float et = 0, st = 0;
  for (size_t j = 0; j < kLanes; ++j) {
    et += e[j];
    st += s[j];
  }
  *err_sq = et;
  *val_sq = st;
}

STRATA_CLONES void dequantize_block_add(const int8_t* q, size_t m, float scale, float* acc) {
  for (size_t i = 0; i < m; ++i) acc[i] += static_cast<float>(q[i]) * scale;
}

STRATA_CLONES void dequantize_block(const int8_t* q, size_t m, float scale, float* out) {
  for (size_t i = 0; i < m; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

}  // namespace

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
    bool finite = true;
    const float amax = block_amax(v.data(), m, &finite);
    if (!finite) {
      if (non_finite == NonFinite::Refuse)
        for (size_t i = 0; i < m; ++i)
          if (!std::isfinite(v[i]))
            throw std::invalid_argument("quantize_int8: element " + std::to_string(first + i) + " is not finite");
      // NonFinite::Propagate: the whole block dequantizes to NaN.
      std::memset(q + first, 0, m);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(scales + 4 * b, &nan, 4);
      continue;
    }
    const float scale = amax > 0 ? amax / 127.0f : 1.0f;
    float err_sq = 0, val_sq = 0;
    quantize_block(v.data(), m, 1.0f / scale, scale, q + first, &err_sq, &val_sq);
    e.error_sq += err_sq;
    e.value_sq += val_sq;
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
    dequantize_block(q + first, m, scale, v.data());
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
    dequantize_block_add(q + first, m, scale, acc + first);
  }
}

}  // namespace strata::math
