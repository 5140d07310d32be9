// The cpu model's matmuls: C = op(A) op(B) (+ bias) (+ C) with fp32 accumulation, over
// operands of F32, BF16 or F16 (docs/mixed-precision.md). Each type takes one path:
//  - F32: sgemm (OpenBLAS's, or oneDNN's where OpenBLAS's kernels are older than the CPU:
//    strata/model/cpu_sgemm.hpp), the bias added after by rows (the fp32 model's math).
//  - BF16 and F16, where oneDNN has an optimised matmul for the type on this CPU (bf16 dot
//    products: avx512_core_bf16 and up; fp16: AVX512-FP16) and the rule below does not
//    prefer converting (choose_gemm16): oneDNN's matmul, the bias and
//    the rounding of a 16-bit output fused into it. Measured on an AMD EPYC with
//    AVX512-BF16, 2 cores, at GPT-2 small's shapes: 365-440 GFLOP/s, sgemm 190.
//  - otherwise (F16 without AVX512-FP16 in oneDNN 2.6; BF16 on a CPU without bf16
//    instructions; or bf16 on an Intel CPU without AMX, as the Intel Xeon VM whose
//    vdpbf16ps issues at half the rate of its fp32 FMAs: oneDNN's bf16 170 GFLOP/s, sgemm
//    335): the 16-bit operands are converted to fp32 in the caller's workspace and
//    multiplied by sgemm, the same products and fp32 sums. Said once in the log.
// oneDNN primitives are made once per shape and kept (making one takes about a
// millisecond, as long as a small matmul) with their memory objects, and share one
// scratchpad, grown as primitives are made (a few MiB, not in the model's
// activation_bytes), so a call allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/dtype.hpp"

namespace strata::detail {

// A row-major matrix operand: `data` holds rows of `ld` elements of `type`; the operand is
// that matrix, or its transpose when `trans`.
struct MatRef {
  const void* data;
  DType type;
  long ld;
  bool trans = false;
  MatRef transposed() const { return {data, type, ld, !trans}; }
};

enum class GemmOutput {
  Overwrite,   // C = op(A) op(B) (+ bias)
  Accumulate,  // C += op(A) op(B) (+ bias); C must be F32
};

// How this process multiplies 16-bit operands, decided once per type (gemm16_choice).
struct Gemm16Choice {
  bool native = false;  // oneDNN's 16-bit matmul; else fp32 sgemm over converted operands
  std::string path;     // "oneDNN brg:avx512_core_bf16 (...)", "fp32 sgemm over converted operands"
  std::string why;      // one sentence: what decided it, and how to force the other
};

// oneDNN's optimised matmul for the 16-bit type t on this CPU: its implementation's name
// ("brg:avx512_core_bf16 (isa avx512_core_bf16)"), or empty with *why saying why there is
// none.
std::string gemm16_native_impl(DType t, std::string* why);

// The environment variable that sets the choice for a 16-bit type: STRATA_CPU_GEMM_BF16 or
// STRATA_CPU_GEMM_FP16.
std::string gemm16_env_var(DType t);

// The decision from its inputs (tested without the machine). env is the type's variable's
// value (null when unset): auto (or unset or empty) follows the rule, onednn or sgemm
// forces a path, anything else is a ConfigError naming the three. native_impl is oneDNN's
// implementation for the type, or empty with `unavailable` saying why there is none
// (forcing onednn then is a ConfigError). The rule, where oneDNN has one: its matmul,
// except bf16 on an Intel CPU without AMX (intel_bf16_without_amx), whose vdpbf16ps gives
// no more FLOPs than its fp32 FMAs, so sgemm over converted operands is faster (1.9x on
// the VM measured, docs/mixed-precision.md). A rule from the CPU's identity, not a timing,
// so that every process on a machine (ranks, a resumed run) takes the same path.
Gemm16Choice choose_gemm16(DType t, const char* env, const std::string& native_impl, const std::string& unavailable,
                           bool intel_bf16_without_amx);

// This process's choice for a 16-bit type, made on first use from the environment, what
// oneDNN offers and the CPU, and logged once (info).
const Gemm16Choice& gemm16_choice(DType t);

// Whether matmuls of operand type t run without converting to fp32 (F32 always; BF16 and
// F16 as gemm16_choice decides).
bool gemm_native(DType t);

// Whether the CPU has bf16 dot-product instructions (AVX512-BF16, as oneDNN sees it): the
// 16-bit attention uses vdpbf16ps there, whichever path the matmuls take.
bool cpu_has_bf16_dot();

// Workspace floats a call of these shapes and types takes when it converts (zero when it
// does not): each 16-bit operand as fp32, and a 16-bit C's fp32 result.
uint64_t gemm_workspace_floats(long M, long N, long K, DType a, DType b, DType c);

// Not thread-safe: one model's matmuls, called from one thread at a time (the model's
// work is split over the cores inside each call).
class CpuGemm {
 public:
  CpuGemm();
  ~CpuGemm();
  CpuGemm(const CpuGemm&) = delete;
  CpuGemm& operator=(const CpuGemm&) = delete;

  // Memory for the converting path (gemm_workspace_floats of the largest call), owned by
  // the caller; a call that needs more is a bug (checked).
  void set_workspace(float* p, uint64_t floats) {
    workspace_ = p;
    workspace_floats_ = floats;
  }

  // C[M,N] (ldc elements per row, of type c_type) = op(A)[M,K] op(B)[K,N] + bias[N]
  // (fp32; none when null), overwritten or accumulated into. A 16-bit C is rounded once.
  void run(long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias, void* c, DType c_type,
           long ldc, GemmOutput out);

  // The same product on a path given rather than the process's choice (native: oneDNN's
  // 16-bit matmul, which must exist for the operands; else sgemm, converting what is
  // 16-bit): for the choice's own measurement and for tests of both paths.
  void run_on(bool native, long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias, void* c,
              DType c_type, long ldc, GemmOutput out);

 private:
  struct Primitive;
  Primitive& primitive(long M, long N, long K, const MatRef& a, const MatRef& b, bool bias, DType c_type, long ldc,
                       GemmOutput out);
  void run_sgemm(long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias, void* c, DType c_type,
                 long ldc, GemmOutput out);

  struct Dnnl;
  std::unique_ptr<Dnnl> dnnl_;  // engine, stream
  std::vector<std::unique_ptr<Primitive>> primitives_;
  std::vector<std::byte> scratchpad_;  // oneDNN's working memory, the largest any primitive asks
  float* workspace_ = nullptr;
  uint64_t workspace_floats_ = 0;
};

// OpenMP's worker threads (oneDNN's) compute with denormals flushed from now on, as the
// calling thread does when this runs inside the model (gpt.cpp, FlushDenormals).
void gemm_threads_flush_denormals();

// The best FLOP/s of this path for type t at a GPT-2-small MLP shape (4096 x 3072 x 768),
// over runs of about `seconds` in total.
double measure_gemm_peak(DType t, double seconds);

}  // namespace strata::detail
