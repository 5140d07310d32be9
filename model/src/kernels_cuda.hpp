// The cuda backend's GPT kernels (kernels_cuda.cu, attention_cuda.cu), as host launchers
// on one stream: the counterpart of kernels_cpu.hpp and attention_cpu.hpp. All pointers
// are device memory; every launch is asynchronous on `s` and checks its launch error.
//
// Compiled and linked in CI, where they never run (no GPU): tests/model/test_gpt_cuda.cpp
// compares them against the cpu model where a GPU is present and skips otherwise (it ran
// and passed on an H100, 2026-11-22; docs/training.md).
//
// This header is included from C++20 (gpt_cuda.cpp) and C++17 CUDA sources alike, so it
// holds plain declarations only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "strata/core/error.hpp"

// The same checker core/src/cuda_device.cu generates (identical definition, so one
// inline function): a failing call aborts naming the call, file, line and rank.
STRATA_DEFINE_CALL_CHECK(check_cuda_call, "cuda", cudaError_t, code == cudaSuccess, cudaGetErrorString(code))
#define STRATA_CHECK_CUDA(expr) ::strata::detail::check_cuda_call((expr), #expr, __FILE__, __LINE__)

namespace strata::detail::cuda {

// x[r] = wte[tok[r]] + wpe[r % T] over rows of d.
void embed_forward(const float* wte, const float* wpe, const int32_t* tok, float* x, long rows, int T, int d,
                   cudaStream_t s);
// dwte[tok[r]] += dres[r] (atomicAdd: tokens repeat); dwpe[t] = sum over b of dres[b*T + t]
// (overwritten; rows t >= T of dwpe, up to seq_len, are left to the caller).
void embed_backward(const float* dres, const int32_t* tok, float* dwte, float* dwpe, int B, int T, int d,
                    cudaStream_t s);

// One block per row: y = LN(x) w + b; mean, rstd [rows] for backward.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, long rows,
                       int n, cudaStream_t s);
// dx += LN backward of dy (one block per row); dw, db overwritten (one thread per column).
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, long rows, int n, cudaStream_t s);

void add_bias_rows(float* y, const float* bias, long rows, int n, cudaStream_t s);  // y[r] += bias
void column_sums(const float* x, float* out, long rows, int n, cudaStream_t s);      // out = sum of rows
void add_into(float* y, const float* x, long n, cudaStream_t s);                     // y += x
void gelu_forward(const float* in, float* out, long n, cudaStream_t s);
void gelu_backward(float* grad, const float* in, long n, cudaStream_t s);  // grad *= gelu'(in)

// Softmax cross-entropy of each row of logits [rows, V]: row_loss[r] = logsumexp - z[target].
// With `backward`, logits become the gradient of the mean loss: (softmax - onehot) * inv_n.
void cross_entropy_rows(float* logits, const int32_t* targets, float* row_loss, long rows, int V, float inv_n,
                        bool backward, cudaStream_t s);

// Causal attention over qkv [B*T, 3d] (q, k, v; heads contiguous) into out [B*T, d] and
// the log-sum-exp lse [B, H, T]. Flash-style: one block per (b, h, query tile), online
// softmax; no more than one [BT, BT] tile of scores exists per block. Both launchers
// throw ConfigError where attention_tile(d / H) is 0.
// The attention kernels' tile rows BT for this head dimension on the current GPU: 64, or
// 32 where a 64-row tile's shared memory is more than a block may have; 0 where neither fits.
int attention_tile(int head_dim);
void attention_forward(const float* qkv, float* out, float* lse, int B, int T, int d, int H, cudaStream_t s);
// dqkv (overwritten) from dout [B*T, d], recomputing scores from lse. dot [B, H, T] is
// scratch for rowsum(dout * out).
void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv,
                        float* dot, int B, int T, int d, int H, cudaStream_t s);

}  // namespace strata::detail::cuda
