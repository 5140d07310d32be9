#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "strata/collectives/dtype.hpp"

using namespace strata::coll;

static_assert(dtype_v<float> == DataType::F32);
static_assert(dtype_v<const double> == DataType::F64);
static_assert(dtype_v<int32_t> == DataType::I32);
static_assert(dtype_v<int64_t> == DataType::I64);
static_assert(dtype_v<uint8_t> == DataType::U8);
static_assert(dtype_v<std::byte> == DataType::U8);
static_assert(dtype_v<Bf16> == DataType::BF16);
static_assert(dtype_v<Fp16> == DataType::F16);
// Raw 16-bit storage is ambiguous (bf16 or fp16?), so it has no datatype.
static_assert(!Element<uint16_t>);
static_assert(!Element<int16_t>);
static_assert(!Element<char*>);

TEST(DataType, SizesAndNames) {
  EXPECT_EQ(size_of(DataType::U8), 1u);
  EXPECT_EQ(size_of(DataType::I32), 4u);
  EXPECT_EQ(size_of(DataType::I64), 8u);
  EXPECT_EQ(size_of(DataType::F16), 2u);
  EXPECT_EQ(size_of(DataType::BF16), 2u);
  EXPECT_EQ(size_of(DataType::F32), 4u);
  EXPECT_EQ(size_of(DataType::F64), 8u);
  EXPECT_STREQ(to_string(DataType::F32), "float");
  EXPECT_STREQ(to_string(DataType::BF16), "bfloat16");
  EXPECT_STREQ(to_string(DataType::F16), "half");
}

TEST(Bf16, IntegersRoundTripExactly) {
  for (int i = -256; i <= 256; ++i) EXPECT_EQ(to_float(to_bf16(static_cast<float>(i))), static_cast<float>(i)) << i;
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(-2.0f).bits, 0xc000);
}

TEST(Bf16, RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: spacing at 1.0 is 2^-7.
  EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f)), 1.0f);                      // tie, to even (down)
  EXPECT_EQ(to_float(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);        // tie, to even (up)
  EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);  // above the tie
  EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-9f)), 1.0f);                      // below the tie
}

TEST(Bf16, SpecialValues) {
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not round into infinity.
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));  // overflows when rounded
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
}

TEST(Fp16, IntegersRoundTripExactly) {
  for (int i = -2048; i <= 2048; ++i) EXPECT_EQ(to_float(to_fp16(static_cast<float>(i))), static_cast<float>(i)) << i;
  EXPECT_EQ(to_fp16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_fp16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_fp16(65504.0f).bits, 0x7bff);  // largest finite
}

TEST(Fp16, RoundsToNearestEven) {
  // fp16 keeps 10 mantissa bits: spacing at 1.0 is 2^-10.
  EXPECT_EQ(to_float(to_fp16(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(to_float(to_fp16(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_EQ(to_float(to_fp16(2049.0f)), 2048.0f);  // tie, to even
  EXPECT_EQ(to_float(to_fp16(2051.0f)), 2052.0f);  // tie, to even
}

TEST(Fp16, OverflowSubnormalsAndSpecials) {
  EXPECT_EQ(to_fp16(65520.0f).bits, 0x7c00);  // rounds past the largest finite: infinity
  EXPECT_EQ(to_fp16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(to_fp16(1e10f).bits, 0x7c00);
  EXPECT_EQ(to_fp16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(to_fp16(0x1p-24f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(to_fp16(0x1p-25f).bits, 0x0000);  // tie, to even (zero)
  EXPECT_EQ(to_fp16(3 * 0x1p-25f).bits, 0x0002);
  EXPECT_EQ(to_fp16(0x1p-14f).bits, 0x0400);  // smallest normal
  EXPECT_EQ(to_float(Fp16{0x0001}), 0x1p-24f);
  EXPECT_EQ(to_float(Fp16{0x03ff}), 1023 * 0x1p-24f);
  EXPECT_EQ(to_fp16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(to_float(to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(to_float(Fp16{0x7c00})));
  // Every fp16 value survives float and back.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    Fp16 h{static_cast<uint16_t>(b)};
    float f = to_float(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_fp16(f).bits, h.bits) << std::hex << b;
  }
}
