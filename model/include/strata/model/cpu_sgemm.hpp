// fp32 matrix products on the CPU, for the cpu model and every measurement of its matmul
// peak: OpenBLAS's sgemm, or oneDNN's where OpenBLAS runs kernels older than the CPU.
//
// Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from the CPU's family and
// model numbers. A CPU newer than the library (an Intel Xeon of family 6 model 207, say)
// gets its generic "Prescott" kernels, SSE3 without FMA: measured on such a 2-core VM,
// 37 GFLOP/s at GPT-2 small's shapes against 220 with OpenBLAS's SkylakeX kernels
// (OPENBLAS_CORETYPE) and 250-268 with oneDNN's sgemm, which dispatches on the CPU's
// feature flags (docs/mixed-precision.md, "CPU matmuls"). OpenBLAS reads
// OPENBLAS_CORETYPE only when it loads, before any code of ours runs, so Strata cannot
// correct its choice; it uses oneDNN's sgemm instead.
//
// The choice, made once per process:
//  - STRATA_CPU_SGEMM=openblas or onednn: that library.
//  - unset, empty or `auto`: oneDNN when the CPU has AVX2 and FMA and OpenBLAS's kernels
//    (openblas_get_corename) are not among those that use them (Haswell, Zen, SkylakeX,
//    Cooperlake, SapphireRapids); OpenBLAS otherwise, where its kernels fit the CPU.
//  - anything else: a ConfigError naming the three values.
#pragma once

#include <string>

namespace strata {

enum class CpuSgemmLibrary { OpenBlas, OneDnn };

struct CpuSgemmChoice {
  CpuSgemmLibrary library = CpuSgemmLibrary::OpenBlas;
  std::string name;  // "OpenBLAS sgemm (Haswell kernels)", "oneDNN sgemm"
  std::string why;   // one sentence: what decided it
};

// The decision from its inputs (tested without the machine): env is STRATA_CPU_SGEMM's
// value (null when unset), openblas_core OpenBLAS's kernel name, and whether the CPU has
// AVX2 and FMA.
CpuSgemmChoice choose_cpu_sgemm(const char* env, const std::string& openblas_core, bool cpu_has_avx2_fma);

// This process's choice, made on first use from the environment and the machine, and
// logged once (info).
const CpuSgemmChoice& cpu_sgemm_choice();

// C = alpha op(A) op(B) + beta C, row-major, op(X) = X or its transpose. With one_thread
// the calling thread computes it alone (a call inside a parallel loop); otherwise it is
// split over every core (oneDNN on OpenMP's team, OpenBLAS on its own threads).
void cpu_sgemm(bool trans_a, bool trans_b, long M, long N, long K, float alpha, const float* A, long lda,
               const float* B, long ldb, float beta, float* C, long ldc, bool one_thread = false);

}  // namespace strata
