#include "strata/model/cpu_sgemm.hpp"

#include <cblas.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include "parallel.hpp"
#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

// Exported by OpenBLAS (every build Debian ships); weak, so that another CBLAS links too.
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace strata {
namespace {

// OpenBLAS's x86 kernels that use AVX2 and FMA (its corename strings, any case).
bool openblas_core_uses_avx2(const std::string& core) {
  static constexpr std::array<std::string_view, 5> kAvx2 = {"haswell", "zen", "skylakex", "cooperlake",
                                                            "sapphirerapids"};
  const std::string c = ascii_lower(core);
  return std::find(kAvx2.begin(), kAvx2.end(), c) != kAvx2.end();
}

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

CpuSgemmChoice choose_cpu_sgemm(const char* env, const std::string& openblas_core, bool avx2_fma) {
  const std::string core = openblas_core.empty() ? "unknown" : openblas_core;
  const std::string openblas = "OpenBLAS sgemm (" + core + " kernels)";
  const std::string v = env ? ascii_lower(env) : "";
  if (v == "openblas") return {CpuSgemmLibrary::OpenBlas, openblas, "STRATA_CPU_SGEMM=openblas"};
  if (v == "onednn") return {CpuSgemmLibrary::OneDnn, "oneDNN sgemm", "STRATA_CPU_SGEMM=onednn"};
  if (!v.empty() && v != "auto")
    throw ConfigError("STRATA_CPU_SGEMM is '" + std::string(env) +
                      "': set it to auto (the default), openblas or onednn, or unset it");
  if (avx2_fma && !openblas_core_uses_avx2(core))
    return {CpuSgemmLibrary::OneDnn, "oneDNN sgemm",
            "OpenBLAS chose its " + core +
                " kernels, which do not use the AVX2 and FMA this CPU has (a CPU newer than this OpenBLAS); "
                "STRATA_CPU_SGEMM=openblas uses them anyway"};
  return {CpuSgemmLibrary::OpenBlas, openblas,
          avx2_fma ? "its kernels use this CPU's AVX2 and FMA; STRATA_CPU_SGEMM=onednn chooses oneDNN's"
                   : "this CPU has no AVX2 and FMA for oneDNN to use beyond OpenBLAS's kernels"};
}

const CpuSgemmChoice& cpu_sgemm_choice() {
  static const CpuSgemmChoice choice = [] {
    const std::string core = openblas_get_corename ? openblas_get_corename() : "";
    CpuSgemmChoice c = choose_cpu_sgemm(std::getenv("STRATA_CPU_SGEMM"), core, cpu_has_avx2_fma());
    // OpenBLAS runs on as many threads as the model's loops (parallel.hpp: fewer where
    // ranks share the cores); it starts with one per core. Also where oneDNN takes the
    // sgemm: the model's sgemv calls stay OpenBLAS's.
    const int threads = static_cast<int>(detail::model_threads());
    if (openblas_set_num_threads && openblas_get_num_threads && openblas_get_num_threads() != threads)
      openblas_set_num_threads(threads);
    log::info("cpu fp32 matmuls: " + c.name + ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") +
              ": " + c.why);
    return c;
  }();
  return choice;
}

void cpu_sgemm(bool trans_a, bool trans_b, long M, long N, long K, float alpha, const float* A, long lda,
               const float* B, long ldb, float beta, float* C, long ldc, bool one_thread) {
  if (cpu_sgemm_choice().library == CpuSgemmLibrary::OpenBlas) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
                static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
    return;
  }
  // oneDNN runs on OpenMP's team of the calling thread: as many threads as the model's
  // loops use, or this one alone.
  dnnl_status_t st;
  {
    const detail::OpenMpTeam team(one_thread ? 1 : detail::model_threads());
    st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  if (st != dnnl_success)
    throw Error("oneDNN sgemm of " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                " failed (dnnl status " + std::to_string(static_cast<int>(st)) +
                "); STRATA_CPU_SGEMM=openblas uses OpenBLAS instead");
}

}  // namespace strata
