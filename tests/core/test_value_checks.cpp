// core/value_checks.hpp: the range check of narrowing conversions agrees with the
// conversion itself (refused exactly where rounding would give inf, for fp16 and bf16,
// around each limit and far beyond), clamps to the largest finite value where asked, and
// names what, where and the limit; the finiteness check names the first NaN or inf.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/value_checks.hpp"

using namespace strata;

namespace {

float widen(DType t, float x) {
  uint16_t h = 0;
  convert_from_f32(&h, t, &x, 1);
  float back = 0;
  convert_to_f32(&back, &h, t, 1);
  return back;
}

std::string refusal(std::vector<float> x, DType t, uint64_t first_index = 0) {
  try {
    check_range(x.data(), x.size(), t, OutOfRange::Refuse, "tensor 'w'", "the fix", first_index);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Values on both sides of t's overflow boundary (one fp32 ulp apart), its largest finite
// value, and values far beyond, of both signs.
std::vector<float> probes(DType t) {
  const float max = static_cast<float>(largest_finite(t));
  std::vector<float> v = {0.0f, 1.0f, max, std::nextafter(max, INFINITY), 1e6f, 1e30f, FLT_MAX};
  for (float edge : {65504.0f, 65519.0f, 65520.0f, std::bit_cast<float>(uint32_t{0x7f7f8000u})})
    v.insert(v.end(), {std::nextafter(edge, 0.0f), edge, std::nextafter(edge, INFINITY)});
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

}  // namespace

TEST(ValueChecks, RefusesExactlyTheValuesThatRoundToInfinity) {
  for (DType t : {DType::F16, DType::BF16}) {
    int refused = 0;
    for (float x : probes(t)) {
      const bool overflows = std::isinf(widen(t, x));
      const std::string m = refusal({0.5f, x, -0.25f}, t);
      EXPECT_EQ(!m.empty(), overflows) << precision_name(t) << " " << x << ": " << m;
      refused += overflows;
    }
    EXPECT_GE(refused, 6) << precision_name(t) << ": the probes reach beyond the range";
  }
  // fp32 holds every finite fp32 value.
  EXPECT_EQ(refusal({FLT_MAX, -FLT_MAX}, DType::F32), "");
}

TEST(ValueChecks, TheRefusalNamesTensorCountLargestIndexAndLimit) {
  const std::string m = refusal({1.0f, 7e4f, -1e6f, 2.0f, 65520.0f}, DType::F16, 100);
  EXPECT_NE(m.find("tensor 'w' holds 3 value(s) beyond fp16's range"), std::string::npos) << m;
  EXPECT_NE(m.find("-1e+06 at flat index 102"), std::string::npos) << m;
  EXPECT_NE(m.find("largest finite value 65504"), std::string::npos) << m;
  EXPECT_NE(m.find("-inf"), std::string::npos) << m;
  EXPECT_NE(m.find("the fix"), std::string::npos) << m;
  const std::string b = refusal({FLT_MAX}, DType::BF16);
  EXPECT_NE(b.find("bf16's largest finite value 3.38953e+38"), std::string::npos) << b;
}

TEST(ValueChecks, ClampGivesTheLargestFiniteValueOfEachSignAndLeavesTheRest) {
  for (DType t : {DType::F16, DType::BF16}) {
    std::vector<float> x = probes(t);
    x.push_back(NAN);  // not a range question: left for check_finite
    const std::vector<float> before = x;
    const uint64_t clamped = check_range(x.data(), x.size(), t, OutOfRange::Clamp, "w", "");
    uint64_t expected = 0;
    const float max = static_cast<float>(largest_finite(t));
    for (size_t i = 0; i + 1 < x.size(); ++i) {
      if (std::isinf(widen(t, before[i]))) {
        ++expected;
        EXPECT_EQ(x[i], std::copysign(max, before[i])) << before[i];
      } else {
        EXPECT_EQ(x[i], before[i]);
      }
      EXPECT_FALSE(std::isinf(widen(t, x[i]))) << before[i];
    }
    EXPECT_TRUE(std::isnan(x.back()));
    EXPECT_EQ(clamped, expected);
  }
}

TEST(ValueChecks, NarrowFromF32ChecksAndLeavesItsSourceAlone) {
  const std::vector<float> src = {1.5f, -3e5f, 65504.0f, 1e9f};
  std::vector<uint16_t> out(src.size(), 0);
  EXPECT_THROW(narrow_from_f32(out.data(), DType::F16, src.data(), src.size(), OutOfRange::Refuse, "w", ""),
               ConfigError);
  narrow_from_f32(out.data(), DType::F16, src.data(), src.size(), OutOfRange::Clamp, "w", "");
  std::vector<float> back(src.size());
  convert_to_f32(back.data(), out.data(), DType::F16, back.size());
  EXPECT_EQ(back, (std::vector<float>{1.5f, -65504.0f, 65504.0f, 65504.0f}));
  EXPECT_EQ(src[3], 1e9f);
  // Within range: the plain conversion, bit for bit.
  const std::vector<float> fine = {0.1f, -2.0f, 300.0f};
  std::vector<uint16_t> a(3), b(3);
  narrow_from_f32(a.data(), DType::BF16, fine.data(), 3, OutOfRange::Refuse, "w", "");
  convert_from_f32(b.data(), DType::BF16, fine.data(), 3);
  EXPECT_EQ(a, b);
}

TEST(ValueChecks, CheckFiniteNamesTheFirstNonFiniteValueAndItsIndex) {
  struct Case {
    std::vector<float> x;
    uint64_t first_index;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{1.0f, NAN, 2.0f}, 0, "holds 1 non-finite value(s), the first nan at flat index 1"},
      {{INFINITY, 0.0f, -INFINITY}, 10, "holds 2 non-finite value(s), the first inf at flat index 10"},
      {{0.0f, 0.0f, 0.0f, -INFINITY}, 5, "the first -inf at flat index 8"},
  };
  for (const Case& c : cases) {
    try {
      check_finite(c.x.data(), c.x.size(), "tensor 'w'", "the fix", c.first_index);
      ADD_FAILURE() << c.expect << ": not refused";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(c.expect), std::string::npos) << m;
      EXPECT_NE(m.find("tensor 'w'"), std::string::npos) << m;
    }
  }
  const std::vector<float> fine = {0.0f, -FLT_MAX, FLT_MIN, 1e-45f};
  EXPECT_NO_THROW(check_finite(fine.data(), fine.size(), "w", ""));
}
