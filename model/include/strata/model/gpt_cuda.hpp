// The GPT of gpt.hpp on the cuda backend: the same model, algorithm and WeightSource
// protocol as Gpt, with every buffer the WeightSource hands out in DEVICE memory (of type
// GptOptions::precision, the group's flat layout from gpt_layout.hpp). Token arrays stay
// host arrays: they are copied to the device here. Linear layers and the tied head are
// cuBLAS (the head over row chunks, as on the cpu): sgemm without TF32 in fp32,
// cublasGemmEx over 16-bit operands with fp32 accumulation on the tensor cores in bf16
// and fp16, rounding where docs/mixed-precision.md says; the rest are the kernels of
// model/src/*_cuda.cu, on one stream this class creates.
//
// Status: compiled and linked in CI (STRATA_HAVE_CUDA), never run there: CI has no GPU.
// tests/model/test_gpt_cuda.cpp compares it against Gpt where a GPU is present and skips
// with the reason elsewhere. fp32 passed on an H100, and fp32, bf16 and fp16, GPT-2 and
// Llama on an H200 (docs/training.md; docs/mixed-precision.md, "The cuda backend"). Built only
// when the cuda backend is (STRATA_HAVE_CUDA).
//
// Synchronisation: the stream is synchronised before the loss or logits are returned and
// before every release_params / grads_ready, so when the model calls those it is done
// with the buffer (the WeightSource contract).
#pragma once

#include <cstdint>
#include <memory>

#include "strata/model/gpt.hpp"

namespace strata {

class GptCuda final : public GptModel {
 public:
  // Allocates every activation and scratch buffer on the current CUDA device up front
  // (activation_bytes(); in 16 bits cuBLAS's workspace too), creates the stream and the
  // cuBLAS handle. Throws OutOfBudget when the GPU cannot hold the activations, and
  // ConfigError for a precision other than F32, BF16 or F16.
  GptCuda(const GptShape& shape, const GptOptions& opts);
  ~GptCuda() override;

  // As Gpt (inputs, targets and logits are HOST arrays; the token ids are copied to the
  // device here); every group's gradient goes to ws's DEVICE gradient buffers.
  double forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets,
                          float loss_scale = 1.0f) override;
  double forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) override;
  void next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* logits) override;

  // Device bytes this model holds for activations and scratch at micro_batch x seq_len.
  uint64_t activation_bytes() const override;
  static uint64_t activation_bytes(const GptShape& shape, const GptOptions& opts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cuBLAS sgemm (fp32, no TF32: the math the model uses) on square matrices on the
// current GPU, best of runs over about `seconds`, FLOP/s: the cuda backend's MFU peak.
double measure_cuda_matmul_peak(double seconds = 0.5);
// The peak in `precision`: the fp32 one above for F32; for BF16 and F16, cublasGemmEx on
// 8192 x 8192 random 16-bit matrices with fp32 accumulation (tensor cores) and a 16-bit
// result, as the model's matmuls. Throws ConfigError for any other type.
double measure_cuda_matmul_peak(DType precision, double seconds = 0.5);

}  // namespace strata
