// What attention_cuda.cu (the dispatch, the Gemm and flash kernels) and
// attention_mma_cuda.cu (the tensor-core kernels, AttentionKernels::Mma) share. CUDA
// sources only (C++17); gpt_cuda.cpp sees kernels_cuda.hpp alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels_cuda.hpp"

namespace strata::detail::cuda {

// The current GPU's shared memory a block may opt in to (bytes).
int max_shared_bytes();

// Lets `kernel` launch with `bytes` of dynamic shared memory (past the 48 KiB default).
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The Mma path's launchers, with attention_forward's and attention_backward's contracts
// (kernels_cuda.hpp); backward's dotp already holds D = rowsum(dO * O) (the flash
// kernels' attention_dot_kernel). t must be BF16 or F16 and d / H a multiple of 16 up to
// kMmaMaxHeadDim, on a GPU of compute capability 8.0 or newer: otherwise they throw
// ConfigError with attention_mma_refusal's or attention_mma_gpu_refusal's reason.
void attention_mma_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                           cudaStream_t s);
void attention_mma_backward(const void* qkv, DType t, const float* lse, const void* dout, float* dqkv,
                            const float* dotp, int B, int T, int d, int H, cudaStream_t s);

}  // namespace strata::detail::cuda
