// The cpu model's fp32 sgemm (strata/model/cpu_sgemm.hpp): which library the process
// takes (STRATA_CPU_SGEMM, else OpenBLAS unless its kernels do not use the CPU's AVX2 and
// FMA), and its products against float64 with alpha, beta, leading dimensions wider than
// the rows and either operand transposed, split over the cores or on the calling thread.
// CTest runs this binary as it is and again with STRATA_CPU_SGEMM=openblas and =onednn
// (tests/model/CMakeLists.txt), so both libraries are checked on every machine.
//
// Tolerance: the same bound as test_gemm_cpu.cpp, K * 2^-24 * sum|terms| per element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata {
namespace {

TEST(CpuSgemm, TheLibraryFollowsTheEnvironmentThenOpenBlasKernels) {
  // auto: OpenBLAS where its kernels use AVX2 and FMA, oneDNN where they do not but the CPU has them.
  for (const char* env : {static_cast<const char*>(nullptr), "", "auto", "AUTO"}) {
    EXPECT_EQ(choose_cpu_sgemm(env, "Haswell", true).library, CpuSgemmLibrary::OpenBlas);
    EXPECT_EQ(choose_cpu_sgemm(env, "SkylakeX", true).library, CpuSgemmLibrary::OpenBlas);
    EXPECT_EQ(choose_cpu_sgemm(env, "Zen", true).library, CpuSgemmLibrary::OpenBlas);
    EXPECT_EQ(choose_cpu_sgemm(env, "Prescott", true).library, CpuSgemmLibrary::OneDnn);
    EXPECT_EQ(choose_cpu_sgemm(env, "Sandybridge", true).library, CpuSgemmLibrary::OneDnn);
    EXPECT_EQ(choose_cpu_sgemm(env, "", true).library, CpuSgemmLibrary::OneDnn);  // not OpenBLAS
    EXPECT_EQ(choose_cpu_sgemm(env, "Prescott", false).library, CpuSgemmLibrary::OpenBlas);
  }
  const CpuSgemmChoice old = choose_cpu_sgemm(nullptr, "Prescott", true);
  EXPECT_NE(old.why.find("Prescott"), std::string::npos) << old.why;
  EXPECT_NE(old.why.find("STRATA_CPU_SGEMM=openblas"), std::string::npos) << old.why;
  EXPECT_EQ(choose_cpu_sgemm(nullptr, "Haswell", true).name, "OpenBLAS sgemm (Haswell kernels)");
  // Forced either way, whatever the kernels.
  EXPECT_EQ(choose_cpu_sgemm("openblas", "Prescott", true).library, CpuSgemmLibrary::OpenBlas);
  EXPECT_EQ(choose_cpu_sgemm("oneDNN", "SkylakeX", true).library, CpuSgemmLibrary::OneDnn);
  try {
    choose_cpu_sgemm("mkl", "Haswell", true);
    FAIL() << "STRATA_CPU_SGEMM=mkl was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'mkl'"), std::string::npos) << what;
    EXPECT_NE(what.find("auto (the default), openblas or onednn"), std::string::npos) << what;
  }
}

TEST(CpuSgemm, TheProcessTakesTheLibraryTheEnvironmentNames) {
  const char* env = std::getenv("STRATA_CPU_SGEMM");
  const CpuSgemmChoice& c = cpu_sgemm_choice();
  std::printf("this process: %s (%s)\n", c.name.c_str(), c.why.c_str());
  if (env && std::string(env) == "openblas") {
    EXPECT_EQ(c.library, CpuSgemmLibrary::OpenBlas);
  }
  if (env && std::string(env) == "onednn") {
    EXPECT_EQ(c.library, CpuSgemmLibrary::OneDnn);
  }
  if (c.library == CpuSgemmLibrary::OneDnn) {
    EXPECT_EQ(c.name, "oneDNN sgemm");
  } else {
    EXPECT_EQ(c.name.rfind("OpenBLAS sgemm (", 0), 0u) << c.name;
  }
}

void check(bool ta, bool tb, bool one_thread) {
  const long M = 67, N = 45, K = 131;  // not multiples of any block size
  const long lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
  const float alpha = 0.75f, beta = -1.5f;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> a((ta ? K : M) * lda), b((tb ? N : K) * ldb), c(M * ldc);
  for (float& x : a) x = n(rng);
  for (float& x : b) x = n(rng);
  for (float& x : c) x = n(rng);
  const std::vector<float> c0 = c;
  cpu_sgemm(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, one_thread);
  for (long i = 0; i < M; ++i) {
    for (long j = 0; j < N; ++j) {
      double sum = 0, mag = 0;
      for (long k = 0; k < K; ++k) {
        const double x = ta ? a[k * lda + i] : a[i * lda + k];
        const double y = tb ? b[j * ldb + k] : b[k * ldb + j];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double want = alpha * sum + beta * c0[i * ldc + j];
      const double bound = (K + 2) * std::ldexp(1.0, -24) * (std::fabs(alpha) * mag + std::fabs(beta * c0[i * ldc + j]));
      ASSERT_NEAR(c[i * ldc + j], want, bound) << "C[" << i << "," << j << "] A" << (ta ? "^T" : "") << " B"
                                               << (tb ? "^T" : "") << (one_thread ? ", one thread" : "");
    }
    for (long j = N; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "written beyond N in row " << i;
  }
}

TEST(CpuSgemm, ProductsAgreeWithFloat64) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool one_thread : {false, true}) check(ta, tb, one_thread);
}

}  // namespace
}  // namespace strata
