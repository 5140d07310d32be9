// The cuda backend's GPT kernels (kernels_cuda.cu, attention_cuda.cu,
// attention_mma_cuda.cu), as host launchers on one stream: the counterpart of
// kernels_cpu.hpp and attention_cpu.hpp. All pointers are device memory; every launch is
// asynchronous on `s` and checks its launch error.
//
// Element types: `t` is the model's precision (F32, BF16 or F16). Pointers typed `void*`
// hold elements of type t: the weights and gradient buffers, and the activations that
// feed a matmul (layer-norm outputs, qkv, the attention output, GELU's output; rounded to
// nearest even when stored, docs/mixed-precision.md). `float*` pointers are fp32 whatever
// t is: the residual stream, statistics, fc, and the gradients of activations. All math
// is fp32 in registers. With t = F32 the conversions are the identity, so fp32 training
// computes exactly what kernels without them would.
//
// Compiled and linked in CI, where they never run (no GPU): tests/model/test_gpt_cuda.cpp
// compares them against the cpu model where a GPU is present and skips otherwise (the
// fp32 kernels have passed on an H100, and all of them, 16-bit and Llama's included, on
// an H200; docs/training.md, docs/mixed-precision.md; the fused path's and the Mma
// attention's have NOT run on a GPU yet).
//
// This header is included from C++20 (gpt_cuda.cpp) and C++17 CUDA sources alike, so it
// holds plain declarations and small inline helpers only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/model/attention_mma_plan.hpp"
#include "strata/model/attention_plan.hpp"
#include "strata/model/cuda_kernel_plan.hpp"

// The same checker core/src/cuda_device.cu generates (identical definition, so one
// inline function): a failing call aborts naming the call, file, line and rank.
STRATA_DEFINE_CALL_CHECK(check_cuda_call, "cuda", cudaError_t, code == cudaSuccess, cudaGetErrorString(code))
#define STRATA_CHECK_CUDA(expr) ::strata::detail::check_cuda_call((expr), #expr, __FILE__, __LINE__)
// cuBLAS's (gpt_cuda.cpp's matmuls, attention_cuda.cu's cuBLAS path).
STRATA_DEFINE_CALL_CHECK(check_cublas_call, "cublas", cublasStatus_t, code == CUBLAS_STATUS_SUCCESS,
                         cublasGetStatusString(code))
#define STRATA_CHECK_CUBLAS(expr) ::strata::detail::check_cublas_call((expr), #expr, __FILE__, __LINE__)

namespace strata::detail::cuda {

// cuBLAS's name for the model's element type t (F32, BF16 or F16).
inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  throw ConfigError(std::string("the cuda GPT computes in f32, bf16 or fp16, not ") + to_string(t));
}

// x[r] = wte[tok[r]] + wpe[r % T] over rows of d, in fp32 (wte, wpe of type t; Llama:
// wpe null, x[r] = wte[tok[r]]).
void embed_forward(const void* wte, const void* wpe, DType t, const int32_t* tok, float* x, long rows, int T, int d,
                   cudaStream_t s);
// dwte[tok[r]] += dres[r] (fp32, atomicAdd: tokens repeat); dwpe[t] = sum over b of
// dres[b*T + t] in fp32, stored as type t (overwritten; rows t >= T of dwpe, up to
// seq_len, are left to the caller; Llama: dwpe null).
void embed_backward(const float* dres, const int32_t* tok, float* dwte, void* dwpe, DType t, int B, int T, int d,
                    cudaStream_t s);

// One block per row: y = LN(x) w + b over fp32 x, stored as type t (w, b of type t);
// mean, rstd [rows] fp32 for backward.
void layernorm_forward(const float* x, const void* w, const void* b, DType t, void* y, float* mean, float* rstd,
                       long rows, int n, cudaStream_t s);
// dx += LN backward of dy (one block per row; fp32); dw, db summed in fp32 and stored
// once as type t, overwritten (one thread per column). w of type t.
void layernorm_backward(const float* dy, const float* x, const void* w, DType t, const float* mean, const float* rstd,
                        float* dx, void* dw, void* db, long rows, int n, cudaStream_t s);

// The fused path's norms (strata.cuda_kernels = "fused"; norm_cuda.cu): the same
// contracts as layernorm_forward / _backward and rmsnorm_forward / _backward above, laid
// out by plan_norm(rows, n, multiprocessors(), ...) (cuda_kernel_plan.hpp). `partials` is
// fp32 scratch of at least the plan's partial_bytes for the gains' (and bias') gradient.
// NOT yet run on a GPU.
void layernorm_forward_rows(const float* x, const void* w, const void* b, DType t, void* y, float* mean, float* rstd,
                            long rows, int n, const NormPlan& p, cudaStream_t s);
void layernorm_backward_rows(const float* dy, const float* x, const void* w, DType t, const float* mean,
                             const float* rstd, float* dx, void* dw, void* db, float* partials, long rows, int n,
                             const NormPlan& p, cudaStream_t s);
void rmsnorm_forward_rows(const float* x, const void* w, DType t, void* y, float* rstd, long rows, int n, float eps,
                          const NormPlan& p, cudaStream_t s);
void rmsnorm_backward_rows(const float* dy, const float* x, const void* w, DType t, const float* rstd, float* dx,
                           void* dw, float* partials, long rows, int n, const NormPlan& p, cudaStream_t s);
// out[c] = sum over the rows of x[r, c] (x fp32 [rows, n], out of type t, rounded once):
// a bias gradient on the fused path where cuBLASLt's epilogue does not take it. Laid out
// by plan_norm(rows, n, multiprocessors(), false): each block of the grid sums a chunk of
// rows for col_tile columns into `partials` (the plan's partial_bytes), then one thread a
// column adds the chunks, where column_sums gives one thread a column all the rows.
void column_sums_rows(const float* x, void* out, DType t, float* partials, long rows, int n, const NormPlan& p,
                      cudaStream_t s);
// grad *= gelu'(pre), pre of type t (the fused path's GELU pre-activation, kept by the
// matmul's epilogue in the output's type), grad fp32.
void gelu_backward_typed(float* grad, const void* pre, DType t, long n, cudaStream_t s);
int multiprocessors();  // of the current GPU

// y[r] += bias (fp32 y, bias of type t).
void add_bias_rows(float* y, const void* bias, DType t, long rows, int n, cudaStream_t s);
// out[r] = round(y[r] + bias): a linear's fp32 result plus its bias, stored as type t.
void add_bias_rows_to(const float* y, const void* bias, DType t, void* out, long rows, int n, cudaStream_t s);
// out = sum of the rows of fp32 x, in fp32, stored once as type t.
void column_sums(const float* x, void* out, DType t, long rows, int n, cudaStream_t s);
void add_into(float* y, const float* x, long n, cudaStream_t s);  // y += x, fp32
// dst = round(src): fp32 to type t (a copy when t is F32).
void round_to(const float* src, void* dst, DType t, long n, cudaStream_t s);
void gelu_forward(const float* in, void* out, DType t, long n, cudaStream_t s);  // out = round(gelu(in))
void gelu_backward(float* grad, const float* in, long n, cudaStream_t s);        // grad *= gelu'(in), fp32

// Softmax cross-entropy of each row of fp32 logits [rows, V]: row_loss[r] = logsumexp -
// z[target]. With `grad` (null: loss only), the gradient of the mean loss times the loss
// scale, (softmax - onehot) * inv_n, is stored as type t in grad [rows, grad_ld]; grad
// may be the logits themselves when t is F32 and grad_ld is V. The logits are scratch.
void cross_entropy_rows(float* logits, const int32_t* targets, float* row_loss, long rows, int V, float inv_n,
                        void* grad, DType t, long grad_ld, cudaStream_t s);

// Llama (gpt_layout.hpp): RMSNorm of fp32 x stored as type t (w of type t), rstd [rows]
// fp32; its backward adds into dx (fp32) and overwrites dw (summed in fp32, stored once).
void rmsnorm_forward(const float* x, const void* w, DType t, void* y, float* rstd, long rows, int n, float eps,
                     cudaStream_t s);
void rmsnorm_backward(const float* dy, const float* x, const void* w, DType t, const float* rstd, float* dx, void* dw,
                      long rows, int n, cudaStream_t s);
// The q, k, v projection p [rows, d + 2 kvd] (fp32) -> attention's qkv [rows, 3d] (type t):
// q and k rotated at position r % T by the fp32 tables cos, sin [T, hd / 2] (rotate-half),
// k and v repeated to the heads / kv_heads query heads that share them.
void rope_expand(const float* p, const float* cosv, const float* sinv, void* qkv, DType t, long rows, int T, int d,
                 int heads, int kv_heads, cudaStream_t s);
// Its backward: dqkv [rows, 3d] (fp32) -> dp [rows, d + 2 kvd] (fp32, overwritten).
void rope_reduce(const float* dqkv, const float* cosv, const float* sinv, float* dp, long rows, int T, int d,
                 int heads, int kv_heads, cudaStream_t s);
// SwiGLU over gu [rows, 2f] = [gate, up] (fp32): out = silu(gate) * up (type t), and its
// backward dgu (fp32, overwritten) from dout [rows, f] (fp32).
void swiglu_forward(const float* gu, void* out, DType t, long rows, int f, cudaStream_t s);
void swiglu_backward(const float* dout, const float* gu, float* dgu, long rows, int f, cudaStream_t s);

// Values of type t drawn from a hash of (seed, index), uniform in [-1, 1): data for the
// matmul peak (not zeros, which run faster than real data on the tensor cores).
void fill_uniform(void* p, DType t, long n, uint32_t seed, cudaStream_t s);

// Causal attention over qkv [B*T, 3d] (q, k, v; heads contiguous; type t) into out
// [B*T, d] (type t, rounded once) and the log-sum-exp lse [B, H, T] (fp32); backward
// writes dqkv. Three implementations of the same math (attention_cuda.cu and
// attention_mma_cuda.cu say how each runs):
enum class AttentionKernels {
  // Default. The scores of a chunk of heads materialised in scratch by cuBLAS (tensor
  // cores in 16 bits; fp32 GEMMs without TF32 in fp32), softmax and dS by small kernels.
  // Any head dimension; scratch from attention_gemm_scratch_bytes.
  Gemm,
  // FlashAttention-2-style tiles in shared memory, fp32 on the CUDA cores: no scratch,
  // but slow at large head dimensions and long sequences, and limited by shared memory
  // (attention_tile). Selected with STRATA_ATTENTION=flash, to compare the two.
  Flash,
  // FlashAttention-2 on the tensor cores (mma.sync, the scores in registers;
  // strata/model/attention_mma_kernels.hpp): no scratch, no [T, T] scores. bf16 and fp16
  // only, head dimensions that are multiples of 16 up to kMmaMaxHeadDim
  // (strata/model/attention_mma_plan.hpp), compute capability 8.0 or newer. Selected with
  // STRATA_ATTENTION=mma. This version checked on the CPU by emulation, NOT yet run on a
  // GPU.
  Mma,
};

// STRATA_ATTENTION: unset, empty or "gemm" -> Gemm; "flash" -> Flash; "mma" -> Mma.
// Anything else throws ConfigError naming the value.
AttentionKernels attention_kernels_from_env();

// Device bytes of scratch the Gemm path needs: strata::attention_gemm_scratch_bytes
// (strata/model/attention_plan.hpp, host-only, shared with the planner).
using strata::attention_gemm_scratch_bytes;

// What the launchers below run on. Gemm needs the caller's cuBLAS handle, already set to
// the launchers' stream `s` (checked) and to the math mode the caller wants (the model's:
// no TF32 in fp32), and scratch of at least attention_gemm_scratch_bytes(T, H, t) bytes
// for the T and H it is called with. Flash and Mma need neither.
struct AttentionPath {
  AttentionKernels kernels = AttentionKernels::Flash;
  cublasHandle_t blas = nullptr;
  void* scratch = nullptr;     // device memory
  uint64_t scratch_bytes = 0;  // bytes
};

// The flash kernels' tile rows BT for this head dimension on the current GPU: 64, or 32
// where a 64-row tile's shared memory is more than a block may have; 0 where neither fits
// (the flash launchers then throw ConfigError; the Gemm path has no such limit).
int attention_tile(int head_dim);
// Why the current GPU cannot run the Mma kernels at this head dimension (compute
// capability before 8.0, or no tile's shared memory fits), or "" where it can. What the
// model's type and head dimension allow anywhere is attention_mma_refusal's
// (strata/model/attention_mma_plan.hpp).
std::string attention_mma_gpu_refusal(int head_dim);
void attention_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                       const AttentionPath& path, cudaStream_t s);
// dqkv [B*T, 3d] (fp32, every element overwritten) from dout [B*T, d] (type t: the
// rounded gradient of out), recomputing the probabilities from lse in fp32. dot [B, H, T]
// is scratch for rowsum(dout * out).
void attention_backward(const void* qkv, const void* out, DType t, const float* lse, const void* dout, float* dqkv,
                        float* dot, int B, int T, int d, int H, const AttentionPath& path, cudaStream_t s);

}  // namespace strata::detail::cuda
