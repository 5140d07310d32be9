// The 16-bit attention (model/src/attention16_cpu.hpp) against a float64 computation that
// rounds at the same points (docs/mixed-precision.md): P rounded for P V, the output
// rounded; backward with dO, P and dS rounded before their matmuls and D = rowsum(dO O)
// over the rounded values. Shapes cover an odd number of tokens and an odd head size
// (pairs padded with zeros), more than two 64-row panels with a short last one, and a
// single token; bf16 (vdpbf16ps where the CPU has it) and fp16 (fp32 arithmetic).
//
// Tolerance: Strata sums in fp32, so now and then a value rounds to the other side of a
// 16-bit boundary than its float64 twin. The output may differ by one such flip, u of its
// size (u: 2^-8 bf16, 2^-11 fp16); a gradient gathers the effect of flipped
// probabilities, measured below 0.02u of the largest gradient; held to 0.1u.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "attention16_cpu.hpp"
#include "strata/core/convert.hpp"

namespace strata::detail {
namespace {

void check(DType t, int B, int T, int d, int H) {
  const int hd = d / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const double u = t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> qkv32(size_t(B) * T * 3 * d), dout(size_t(B) * T * d), lse(size_t(B) * H * T),
      dqkv(qkv32.size());
  for (float& x : qkv32) x = n(rng);
  for (float& x : dout) x = n(rng);
  std::vector<uint16_t> qkv(qkv32.size()), out(dout.size());
  convert_from_f32(qkv.data(), t, qkv32.data(), qkv.size());
  std::vector<std::byte> workspace(attention16_workspace_bytes(t, T, hd));
  attention16_forward(qkv.data(), out.data(), t, lse.data(), B, T, d, H, workspace);
  attention16_backward(qkv.data(), out.data(), t, lse.data(), dout.data(), dqkv.data(), B, T, d, H, workspace);

  auto value = [&](uint16_t bits) {
    float f;
    convert_to_f32(&f, &bits, t, 1);
    return static_cast<double>(f);
  };
  auto round = [&](double x) {
    const float f = static_cast<float>(x);
    uint16_t bits;
    convert_from_f32(&bits, t, &f, 1);
    return value(bits);
  };
  double out_diff = 0, out_max = 0, grad_diff = 0, grad_max = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      auto at = [&](int part, int i, int c) { return value(qkv[(size_t(b) * T + i) * 3 * d + part * d + h * hd + c]); };
      auto dO = [&](int i, int c) { return round(dout[(size_t(b) * T + i) * d + h * hd + c]); };
      std::vector<double> P(size_t(T) * T, 0.0), O(size_t(T) * hd), dQ(O.size(), 0.0), dK(O.size(), 0.0),
          dV(O.size(), 0.0);
      for (int i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < hd; ++c) dot += at(0, i, c) * at(1, j, c);
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) P[size_t(i) * T + j] = std::exp(s[j] - mx) / sum;
        for (int c = 0; c < hd; ++c) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += round(P[size_t(i) * T + j]) * at(2, j, c);
          O[size_t(i) * hd + c] = round(o);
          const double ours = value(out[(size_t(b) * T + i) * d + h * hd + c]);
          out_diff = std::max(out_diff, std::abs(ours - O[size_t(i) * hd + c]));
          out_max = std::max(out_max, std::abs(O[size_t(i) * hd + c]));
        }
      }
      for (int i = 0; i < T; ++i) {
        double D = 0;
        for (int c = 0; c < hd; ++c) D += dO(i, c) * O[size_t(i) * hd + c];
        for (int j = 0; j <= i; ++j) {
          double dp = 0;
          for (int c = 0; c < hd; ++c) dp += dO(i, c) * at(2, j, c);
          const double p = P[size_t(i) * T + j], ds = round(p * (dp - D));
          for (int c = 0; c < hd; ++c) {
            dV[size_t(j) * hd + c] += round(p) * dO(i, c);
            dQ[size_t(i) * hd + c] += scale * ds * at(1, j, c);
            dK[size_t(j) * hd + c] += scale * ds * at(0, i, c);
          }
        }
      }
      for (int i = 0; i < T; ++i)
        for (int c = 0; c < hd; ++c)
          for (int part = 0; part < 3; ++part) {
            const double ref = (part == 0 ? dQ : part == 1 ? dK : dV)[size_t(i) * hd + c];
            const double ours = dqkv[(size_t(b) * T + i) * 3 * d + part * d + h * hd + c];
            grad_diff = std::max(grad_diff, std::isnan(ours) ? INFINITY : std::abs(ours - ref));
            grad_max = std::max(grad_max, std::abs(ref));
          }
    }
  const std::string what = std::string(to_string(t)) + " B" + std::to_string(B) + " T" + std::to_string(T) + " d" +
                           std::to_string(d) + " H" + std::to_string(H);
  ASSERT_GT(out_max, 0.1) << what;
  ASSERT_GT(grad_max, 0.1) << what;
  EXPECT_LE(out_diff, u * out_max) << what;
  EXPECT_LE(grad_diff, 0.1 * u * grad_max) << what;
  std::printf("%-22s output max|diff| %.3g u, gradients max|diff| / max|ref| %.3g u\n", what.c_str(),
              out_diff / out_max / u, grad_diff / grad_max / u);
}

TEST(Attention16, MatchesTheSameRoundingInFloat64) {
  const std::array<std::array<int, 4>, 3> shapes{{{2, 37, 10, 2}, {1, 130, 12, 2}, {2, 1, 6, 3}}};
  for (DType t : {DType::BF16, DType::F16})
    for (const auto& [B, T, d, H] : shapes) check(t, B, T, d, H);
}

}  // namespace
}  // namespace strata::detail
