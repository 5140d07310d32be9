// Block-wise int8 quantization (core/math/quantize.hpp) against a reference written here:
// every value within half a step of its block's scale, the scales those of the blocks'
// largest magnitudes, a partial last block, zeros, the three working types, and
// non-finite values refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/math/quantize.hpp"

using namespace strata;

namespace {
uint64_t qbytes(size_t n, size_t block) { return n + 4 * ((n + block - 1) / block); }
}  // namespace

TEST(QuantizeInt8, EveryValueWithinHalfAStepOfItsBlock) {
  std::mt19937 rng(11);
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (size_t n : {1000u, 1024u, 7u}) {
      const size_t block = 64;
      std::vector<float> x(n);
      std::normal_distribution<float> d(0.0f, 0.05f);
      for (float& v : x) v = d(rng);
      x[3] = 0.5f;  // one outlier in the first block
      std::vector<std::byte> src(n * dtype_size(t));
      convert_from_f32(src.data(), t, x.data(), n);
      std::vector<float> exact(n);
      convert_to_f32(exact.data(), src.data(), t, n);  // what was quantized
      std::vector<uint8_t> q(qbytes(n, block), 0xAB);
      const math::QuantizeError e = math::quantize_int8(src.data(), t, n, block, q.data());
      std::vector<std::byte> back(n * dtype_size(t));
      math::dequantize_int8(q.data(), n, block, back.data(), t);
      std::vector<float> got(n);
      convert_to_f32(got.data(), back.data(), t, n);
      double err = 0, val = 0;
      for (size_t b = 0; b * block < n; ++b) {
        float amax = 0;
        for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) amax = std::max(amax, std::fabs(exact[i]));
        float scale;
        std::memcpy(&scale, q.data() + n + 4 * b, 4);
        EXPECT_FLOAT_EQ(scale, amax / 127.0f) << "block " << b;
        for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
          // The buffer's value, as the receiver reads it: the int8 times the block's scale,
          // within half a step of what was quantized.
          const double sent = double(reinterpret_cast<const int8_t*>(q.data())[i]) * scale;
          EXPECT_LE(std::fabs(sent - exact[i]), scale / 2 * 1.0001) << "element " << i;
          // The dequantized value is that, rounded once more to the working type.
          const double ulp = t == DType::F32 ? 0x1p-23 : t == DType::BF16 ? 0x1p-7 : 0x1p-10;
          EXPECT_NEAR(got[i], sent, std::fabs(sent) * ulp) << to_string(t) << " element " << i;
          err += (sent - exact[i]) * (sent - exact[i]);
          val += double(exact[i]) * exact[i];
        }
      }
      EXPECT_NEAR(e.relative(), std::sqrt(err / val), 1e-6 * std::sqrt(err / val) + 1e-12);
      EXPECT_GT(e.relative(), 0.0);
      EXPECT_LT(e.relative(), 0.02);
    }
}

TEST(QuantizeInt8, ZerosStayZeroAndNonFiniteIsRefused) {
  std::vector<float> z(100, 0.0f);
  std::vector<uint8_t> q(qbytes(100, 32));
  EXPECT_EQ(math::quantize_int8(z.data(), DType::F32, 100, 32, q.data()).relative(), 0.0);
  std::vector<float> back(100, 1.0f);
  math::dequantize_int8(q.data(), 100, 32, back.data(), DType::F32);
  for (float v : back) EXPECT_EQ(v, 0.0f);
  z[40] = std::nanf("");
  EXPECT_THROW(math::quantize_int8(z.data(), DType::F32, 100, 32, q.data()), std::invalid_argument);
  z[40] = INFINITY;
  EXPECT_THROW(math::quantize_int8(z.data(), DType::F32, 100, 32, q.data()), std::invalid_argument);
  EXPECT_THROW(math::quantize_int8(z.data(), DType::F32, 100, 0, q.data()), std::invalid_argument);
}

// Gradients (qgZ): a non-finite value makes its block NaN on arrival, so the finite check
// after the reduction sees it; the other blocks arrive as usual, and the error leaves the
// NaN block out.
TEST(QuantizeInt8, NonFiniteGradientsPropagateAsTheirBlock) {
  std::vector<float> g(100);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i) - 0.3f;
  g[40] = INFINITY;
  std::vector<uint8_t> q(qbytes(100, 32));
  const math::QuantizeError e = math::quantize_int8(g.data(), DType::F32, 100, 32, q.data(), math::NonFinite::Propagate);
  EXPECT_GT(e.relative(), 0.0);
  EXPECT_LT(e.relative(), 0.01);
  std::vector<float> back(100, 0.0f);
  math::dequantize_int8(q.data(), 100, 32, back.data(), DType::F32);
  for (size_t i = 0; i < 100; ++i) {
    if (i >= 32 && i < 64)
      EXPECT_TRUE(std::isnan(back[i])) << i;
    else
      EXPECT_NEAR(back[i], g[i], 0.7f / 254) << i;  // half a step of the largest block (0.69)
  }
}

// The fp32 sum of several ranks' quantized parts: each adds its dequantized values.
TEST(QuantizeInt8, DequantizeAddSumsIntoFp32) {
  const size_t n = 70, block = 16;
  std::vector<float> a(n), b(n), acc(n, 0.5f), a_back(n), b_back(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = std::sin(0.3f * static_cast<float>(i));
    b[i] = 2.0f * std::cos(0.7f * static_cast<float>(i));
  }
  std::vector<uint8_t> qa(qbytes(n, block)), qb(qbytes(n, block));
  math::quantize_int8(a.data(), DType::F32, n, block, qa.data());
  math::quantize_int8(b.data(), DType::F32, n, block, qb.data());
  math::dequantize_int8(qa.data(), n, block, a_back.data(), DType::F32);
  math::dequantize_int8(qb.data(), n, block, b_back.data(), DType::F32);
  math::dequantize_add_int8(qa.data(), n, block, acc.data());
  math::dequantize_add_int8(qb.data(), n, block, acc.data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(acc[i], 0.5f + a_back[i] + b_back[i], 1e-6f) << i;  // a fused multiply-add may round once
    EXPECT_NEAR(acc[i], 0.5f + a[i] + b[i], 2.0f / 127 + 1.0f / 127) << i;
  }
  EXPECT_THROW(math::dequantize_add_int8(qa.data(), n, 0, acc.data()), std::invalid_argument);
}
