// The cpu model's matmuls: C = op(A) op(B) (+ bias) (+ C) with fp32 accumulation, over
// operands of F32, BF16 or F16 (docs/mixed-precision.md). Each type takes one path:
//  - F32: sgemm (OpenBLAS's, or oneDNN's where OpenBLAS's kernels are older than the CPU:
//    strata/model/cpu_sgemm.hpp), the bias added after by rows (the fp32 model's math).
//  - BF16 on a CPU with bf16 dot-product instructions (oneDNN's avx512_core_bf16 and up):
//    oneDNN's matmul, the bias and the rounding of a 16-bit output fused into it. Measured
//    on an AMD EPYC with AVX512-BF16, 2 cores, at GPT-2 small's shapes: 365-440 GFLOP/s,
//    sgemm 190.
//  - anything else (F16: oneDNN 2.6 has no fp16 matmul without AVX512-FP16; BF16 on a CPU
//    without bf16 instructions, where oneDNN would emulate them): the 16-bit operands are
//    converted to fp32 in the caller's workspace and multiplied by sgemm, the same products
//    and fp32 sums. Said once in the log.
// oneDNN primitives are made once per shape and kept (making one takes about a
// millisecond, as long as a small matmul) with their memory objects, and share one
// scratchpad, grown as primitives are made (a few MiB, not in the model's
// activation_bytes), so a call allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

// Whether matmuls of operand type t run without converting to fp32 (F32 always; BF16 with
// oneDNN on a CPU with bf16 instructions). Probed once per process.
bool gemm_native(DType t);

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
