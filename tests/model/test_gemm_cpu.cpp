// The cpu model's matmul layer (model/src/gemm_cpu.hpp) against a float64 product of the
// same (16-bit) values: every operand type (F32: sgemm; BF16 and F16 on the path this
// process chose, and again on each path the CPU has: oneDNN's 16-bit matmul and sgemm over
// converted operands), transposed operands, the bias, accumulating into C, a 16-bit C
// (rounded once), mixed 16-bit and fp32 operands, and a second call of a cached primitive
// with other data. Also the choice between the two paths, from its inputs.
//
// Tolerance: both sides multiply the same values exactly; Strata sums K products in
// fp32, so |diff| <= K * 2^-24 * sum|products| bounds it (sum|products| per element);
// a 16-bit C may also differ by one rounding of the sum, half an ulp of the 16-bit type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemm_cpu.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"

namespace strata::detail {
namespace {

struct Matrix {
  DType type;
  int rows, cols;
  std::vector<std::byte> bytes;
  std::vector<double> values;  // as stored, after rounding to the type

  Matrix(DType t, int r, int c, std::mt19937& rng) : type(t), rows(r), cols(c), bytes(size_t(r) * c * dtype_size(t)) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> f(size_t(r) * c), back(f.size());
    for (float& x : f) x = n(rng);
    convert_from_f32(bytes.data(), t, f.data(), f.size());
    convert_to_f32(back.data(), bytes.data(), t, back.size());
    values.assign(back.begin(), back.end());
  }
  double at(int r, int c) const { return values[size_t(r) * cols + c]; }
};

struct Case {
  DType a, b, c;
  bool ta, tb, bias, accumulate;
};

std::string name(const Case& k) {
  return std::string(to_string(k.a)) + "x" + to_string(k.b) + "->" + to_string(k.c) + (k.ta ? " A^T" : "") +
         (k.tb ? " B^T" : "") + (k.bias ? " +bias" : "") + (k.accumulate ? " +=C" : "");
}

enum class Path { Chosen, OneDnn, Sgemm };

void check(const Case& k, Path path = Path::Chosen) {
  const int M = 37, N = 53, K = 70;  // not multiples of any block size
  std::mt19937 rng(11);
  const Matrix A(k.a, k.ta ? K : M, k.ta ? M : K, rng), B(k.b, k.tb ? N : K, k.tb ? K : N, rng);
  std::vector<float> bias(N), c0(size_t(M) * N);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& x : bias) x = n(rng);
  for (float& x : c0) x = n(rng);
  std::vector<std::byte> c(size_t(M) * N * dtype_size(k.c));
  if (k.accumulate) std::memcpy(c.data(), c0.data(), c.size());
  CpuGemm gemm;
  // Forced onto sgemm, every operand may need its fp32 copy.
  std::vector<float> workspace(path == Path::Sgemm ? size_t(M) * K + size_t(K) * N + size_t(M) * N
                                                   : gemm_workspace_floats(M, N, K, k.a, k.b, k.c));
  gemm.set_workspace(workspace.data(), workspace.size());
  for (int call = 0; call < 2; ++call) {  // the second call reuses the primitive made by the first
    const GemmOutput out = k.accumulate ? GemmOutput::Accumulate : GemmOutput::Overwrite;
    if (k.accumulate) std::memcpy(c.data(), c0.data(), c.size());
    const MatRef a{A.bytes.data(), k.a, A.cols, k.ta}, b{B.bytes.data(), k.b, B.cols, k.tb};
    if (path == Path::Chosen)
      gemm.run(M, N, K, a, b, k.bias ? bias.data() : nullptr, c.data(), k.c, N, out);
    else
      gemm.run_on(path == Path::OneDnn, M, N, K, a, b, k.bias ? bias.data() : nullptr, c.data(), k.c, N, out);
    std::vector<float> got(size_t(M) * N);
    convert_to_f32(got.data(), c.data(), k.c, got.size());
    // The unit roundoff of a 16-bit C: 2^-8 (bf16), 2^-11 (fp16).
    const double half_ulp = k.c == DType::BF16 ? std::ldexp(1.0, -8) : k.c == DType::F16 ? std::ldexp(1.0, -11) : 0;
    double worst = 0, largest = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double ref = (k.bias ? bias[j] : 0.0) + (k.accumulate ? c0[size_t(i) * N + j] : 0.0), mag = std::abs(ref);
        for (int p = 0; p < K; ++p) {
          const double prod = (k.ta ? A.at(p, i) : A.at(i, p)) * (k.tb ? B.at(j, p) : B.at(p, j));
          ref += prod;
          mag += std::abs(prod);
        }
        const double diff = std::abs(got[size_t(i) * N + j] - ref);
        const double tol = (K + 2) * std::ldexp(1.0, -24) * mag + half_ulp * std::abs(ref) * 1.01;
        ASSERT_LE(diff, tol) << name(k) << " at (" << i << ", " << j << "), call " << call;
        worst = std::max(worst, diff / tol);
        largest = std::max(largest, std::abs(ref));
      }
    ASSERT_GT(largest, 1.0) << name(k) << ": the reference is near zero; the test would prove little";
    if (call == 0) std::printf("%-34s worst |diff| / tolerance %.3f\n", name(k).c_str(), worst);
  }
}

TEST(CpuGemm, EveryTypeTransposeBiasAndAccumulationMatchesFloat64) {
  const DType f = DType::F32;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) check({t, t, f, ta, tb, false, false});
  for (DType t : {DType::BF16, DType::F16}) {
    check({t, t, f, false, true, true, false});   // a linear layer: Y = X W^T + b
    check({t, t, t, false, true, true, false});   // ... stored rounded (qkv)
    check({t, t, t, true, false, false, false});  // a weight gradient dW = dY^T X, rounded
    check({t, t, f, true, false, false, true});   // the tied head's dwte += dlogits^T lnf
    check({t, f, f, false, true, false, false});  // 16-bit activations times fp32 weights
  }
  check({f, f, f, false, true, true, true});
}

TEST(CpuGemm, BothSixteenBitPathsMatchFloat64) {
  const DType f = DType::F32;
  for (DType t : {DType::BF16, DType::F16}) {
    std::string why;
    const bool onednn = !gemm16_native_impl(t, &why).empty();
    if (!onednn) std::printf("%s: oneDNN's path not on this CPU (%s)\n", to_string(t), why.c_str());
    for (Path path : {Path::OneDnn, Path::Sgemm}) {
      if (path == Path::OneDnn && !onednn) continue;
      for (bool ta : {false, true})
        for (bool tb : {false, true}) check({t, t, f, ta, tb, false, false}, path);
      check({t, t, f, false, true, true, false}, path);
      check({t, t, t, false, true, true, false}, path);
      check({t, t, t, true, false, false, false}, path);
      check({t, t, f, true, false, false, true}, path);
    }
  }
}

TEST(CpuGemm16Choice, IntelWithoutAmxConvertsBf16AndOthersKeepOneDnn) {
  const std::string impl = "brg:avx512_core_bf16 (isa avx512_core_bf16)";
  const Gemm16Choice intel = choose_gemm16(DType::BF16, nullptr, impl, "", true);
  EXPECT_FALSE(intel.native);
  EXPECT_NE(intel.why.find("an Intel CPU without AMX"), std::string::npos) << intel.why;
  EXPECT_NE(intel.why.find("STRATA_CPU_GEMM_BF16=onednn"), std::string::npos) << intel.why;
  const Gemm16Choice other = choose_gemm16(DType::BF16, "auto", impl, "", false);  // AMD EPYC, AMX
  EXPECT_TRUE(other.native);
  EXPECT_NE(other.path.find(impl), std::string::npos) << other.path;
  EXPECT_NE(other.why.find("STRATA_CPU_GEMM_BF16=sgemm"), std::string::npos) << other.why;
  EXPECT_TRUE(choose_gemm16(DType::BF16, "", impl, "", false).native);
}

TEST(CpuGemm16Choice, ForcedPathsAndBadValues) {
  const std::string impl = "brg:avx512_core_bf16";
  EXPECT_TRUE(choose_gemm16(DType::BF16, "onednn", impl, "", true).native);
  EXPECT_FALSE(choose_gemm16(DType::BF16, "SGEMM", impl, "", false).native);
  const Gemm16Choice none = choose_gemm16(DType::F16, nullptr, "", "oneDNN cannot make the matmul", false);
  EXPECT_FALSE(none.native);
  EXPECT_NE(none.why.find("oneDNN cannot make the matmul"), std::string::npos) << none.why;
  EXPECT_FALSE(choose_gemm16(DType::F16, "sgemm", "", "no fp16", false).native);
  try {
    choose_gemm16(DType::F16, "onednn", "", "oneDNN cannot make the matmul", false);
    FAIL() << "onednn was accepted where oneDNN has no fp16 matmul";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("STRATA_CPU_GEMM_FP16=onednn, but oneDNN has no optimised fp16 matmul"), std::string::npos)
        << what;
    EXPECT_NE(what.find("set it to auto or sgemm"), std::string::npos) << what;
  }
  try {
    choose_gemm16(DType::BF16, "mkl", impl, "", false);
    FAIL() << "mkl was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("STRATA_CPU_GEMM_BF16 is 'mkl': set it to auto (the default), onednn or sgemm"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuGemm, MeasuredPeaksArePositive) {
  for (DType t : {DType::BF16, DType::F16}) EXPECT_GT(measure_gemm_peak(t, 0.05), 1e9) << to_string(t);
}

}  // namespace
}  // namespace strata::detail
