// How the cuda model's attention (the Gemm path, model/src/attention_cuda.cu) cuts its
// work into units under a scratch of some size, and the device bytes of that scratch:
// host-only arithmetic, shared by the kernels and by `strata plan`, which counts the
// scratch among a GPU's activation bytes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "strata/core/dtype.hpp"

namespace strata {

// The cap on the Gemm path's scratch, bytes: the [T, T] scores of 16 heads at 1024 tokens
// in 16 bits (12 bytes a score) fit in 192 MiB, so a 1.1B GPT's micro-batch item is one
// unit.
inline constexpr uint64_t kAttentionScratchCap = 256ull << 20;

struct AttentionGemmPlan {
  int heads;        // heads per unit
  int rows;         // query rows per unit: T, or fewer where one head's scores exceed the scratch
  long ld;          // elements per score row: T rounded up to 8 (16-byte rows for the tensor cores)
  long block;       // elements per score buffer: heads x rows x ld
  int score_bytes;  // bytes per score over the buffers: S, dP fp32; in 16 bits also P, dS

  uint64_t bytes() const { return static_cast<uint64_t>(block) * score_bytes; }
};

inline AttentionGemmPlan attention_gemm_plan(int T, int H, DType t, uint64_t scratch_bytes) {
  AttentionGemmPlan p{};
  p.ld = (T + 7L) / 8 * 8;
  p.score_bytes = t == DType::F32 ? 8 : 12;
  // At least one row, should the cap not hold one (a T of millions).
  const long rows = std::max<long>(1, static_cast<long>(scratch_bytes / (static_cast<uint64_t>(p.ld) * p.score_bytes)));
  p.heads = rows >= T ? static_cast<int>(std::min<long>(H, rows / T)) : 1;
  p.rows = rows >= T ? T : static_cast<int>(rows);
  p.block = static_cast<long>(p.heads) * p.rows * p.ld;
  return p;
}

// Device bytes of scratch the Gemm path needs for sequences of up to T tokens and H heads
// in type t: the scores of as many heads as fit under the cap (one head's query rows in
// chunks where a head alone exceeds it), whatever the batch.
inline uint64_t attention_gemm_scratch_bytes(int T, int H, DType t) {
  return attention_gemm_plan(T, H, t, kAttentionScratchCap).bytes();
}

}  // namespace strata
