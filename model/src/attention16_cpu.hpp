// The 16-bit model's causal attention (docs/mixed-precision.md; attention_cpu.hpp is the
// fp32 model's): q, k, v and the output in bf16 or fp16 (uint16_t bits), the rest fp32.
//
// One panel of 64 query rows at a time against all the keys it sees: the panel's scores
// [64, T] (fp32) are at most a few hundred KiB per core, so the softmax is exact per row
// (no running rescale) and P = softmax(scores) is rounded once for P V, as the contract
// and the reference have it. Backward recomputes P from the fp32 log-sum-exp and rounds
// dO, P and dS before their matmuls. Matmuls take their 16-bit operands in pairs along
// the inner dimension: AVX512-BF16's vdpbf16ps for bf16 where the CPU has it, else the
// same values as floats with fp32 arithmetic (fp16; bf16 without bf16 instructions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/dtype.hpp"

namespace strata::detail {

// Bytes of workspace the calls below take for sequences of up to T tokens and heads of hd
// values: a few MiB (2.3 per core at GPT-2's 1024 x 64), owned by the caller.
size_t attention16_workspace_bytes(DType t, int T, int hd);

// Shapes as attention_cpu.hpp's; t is BF16 or F16; q, k, v and out are its bits.
void attention16_forward(const uint16_t* qkv, uint16_t* out, DType t, float* lse, int B, int T, int d, int H,
                         std::span<std::byte> workspace);
void attention16_backward(const uint16_t* qkv, const uint16_t* out, DType t, const float* lse, const float* dout,
                          float* dqkv, int B, int T, int d, int H, std::span<std::byte> workspace);

}  // namespace strata::detail
