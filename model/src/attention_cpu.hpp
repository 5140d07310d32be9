// Causal multi-head attention on the cpu backend, one [block, block] tile of scores at a
// time (online softmax forward; backward recomputes each tile from the saved row
// log-sum-exp), as FlashAttention does on a GPU.
//
// q, k, v and the output are of type t: F32 (the tiles below, OpenBLAS sgemm), or BF16 /
// F16 when the model computes in 16 bits (attention16_cpu.hpp).
#pragma once

#include "strata/core/dtype.hpp"

namespace strata::detail {

// qkv:  [B, T, 3d] rows of q (d), k (d), v (d); head h uses channels [h*hd, (h+1)*hd) of each
// out:  [B, T, d]   softmax(q k^T / sqrt(hd), causal) v, heads side by side
// lse:  [B, H, T]   log-sum-exp of each query row's scaled scores (for backward), fp32
void attention_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H);

// dout [B, T, d] fp32 -> dqkv [B, T, 3d] fp32 (overwritten).
void attention_backward(const void* qkv, const void* out, DType t, const float* lse, const float* dout, float* dqkv,
                        int B, int T, int d, int H);

}  // namespace strata::detail
