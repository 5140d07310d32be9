// Causal multi-head attention on the cpu backend, one [block, block] tile of scores at a
// time (online softmax forward; backward recomputes each tile from the saved row
// log-sum-exp), as FlashAttention does on a GPU.
#pragma once

namespace strata::detail {

// qkv:  [B, T, 3d] rows of q (d), k (d), v (d); head h uses channels [h*hd, (h+1)*hd) of each
// out:  [B, T, d]   softmax(q k^T / sqrt(hd), causal) v, heads side by side
// lse:  [B, H, T]   log-sum-exp of each query row's scaled scores (for backward)
void attention_forward(const float* qkv, float* out, float* lse, int B, int T, int d, int H);

// dout [B, T, d] -> dqkv [B, T, 3d] (overwritten).
void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, int B,
                        int T, int d, int H);

}  // namespace strata::detail
