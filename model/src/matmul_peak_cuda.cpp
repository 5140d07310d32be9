// measure_cuda_matmul_peak (gpt_cuda.hpp): the best rate of square cuBLAS products on the
// current GPU, fp32 as the model's sgemm, 16 bits as its GemmEx. Moved out of gpt_cuda.cpp
// unchanged (that file holds the model).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <string>

#include "kernels_cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/model/gpt_cuda.hpp"

namespace strata {

namespace cu = detail::cuda;
using cu::cuda_type;

namespace {

// Best FLOP/s of `run` (one n x n x n product on `stream`, enqueued by cuBLAS) over
// batches of a few runs, for about `seconds` of GPU time in total, after one warm-up run
// (kernel selection, clocks).
double best_matmul_rate(const std::function<void()>& run, cudaStream_t stream, int n, double seconds) {
  cudaEvent_t start = nullptr, stop = nullptr;
  STRATA_CHECK_CUDA(cudaEventCreate(&start));
  STRATA_CHECK_CUDA(cudaEventCreate(&stop));
  run();
  STRATA_CHECK_CUDA(cudaStreamSynchronize(stream));
  double best = 0, spent = 0;
  do {
    constexpr int kReps = 4;
    STRATA_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int r = 0; r < kReps; ++r) run();
    STRATA_CHECK_CUDA(cudaEventRecord(stop, stream));
    STRATA_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    STRATA_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    spent += ms / 1e3;
    best = std::max(best, kReps * 2.0 * n * n * static_cast<double>(n) / (ms / 1e3));
  } while (spent < seconds);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// Three n x n matrices of `bytes_per` bytes per element on the current GPU, a stream and a
// cuBLAS handle on it; freed on scope exit.
struct MatmulBench {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t h = nullptr;
  MatmulBench(int n, size_t bytes_per) {
    const size_t bytes = static_cast<size_t>(n) * n * bytes_per;
    STRATA_CHECK_CUDA(cudaMalloc(&a, bytes));
    STRATA_CHECK_CUDA(cudaMalloc(&b, bytes));
    STRATA_CHECK_CUDA(cudaMalloc(&c, bytes));
    STRATA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    STRATA_CHECK_CUBLAS(cublasCreate(&h));
    STRATA_CHECK_CUBLAS(cublasSetStream(h, stream));
  }
  ~MatmulBench() {
    cudaStreamSynchronize(stream);
    cublasDestroy(h);
    cudaStreamDestroy(stream);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
};

}  // namespace

double measure_cuda_matmul_peak(double seconds) {
  const int n = 4096;
  MatmulBench m(n, sizeof(float));
  STRATA_CHECK_CUDA(cudaMemsetAsync(m.a, 0, static_cast<size_t>(n) * n * sizeof(float), m.stream));
  STRATA_CHECK_CUDA(cudaMemsetAsync(m.b, 0, static_cast<size_t>(n) * n * sizeof(float), m.stream));
  STRATA_CHECK_CUBLAS(cublasSetMathMode(m.h, CUBLAS_DEFAULT_MATH));  // fp32, as the model
  const float one = 1.0f, zero = 0.0f;
  const auto* a = static_cast<const float*>(m.a);
  const auto* b = static_cast<const float*>(m.b);
  auto* c = static_cast<float*>(m.c);
  return best_matmul_rate(
      [&] { STRATA_CHECK_CUBLAS(cublasSgemm(m.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n)); },
      m.stream, n, seconds);
}

double measure_cuda_matmul_peak(DType precision, double seconds) {
  if (precision == DType::F32) return measure_cuda_matmul_peak(seconds);
  if (precision != DType::BF16 && precision != DType::F16)
    throw ConfigError(std::string("measure_cuda_matmul_peak: no matmul peak for ") + to_string(precision) +
                      "; the model computes in f32, bf16 or fp16");
  // 8192: large enough to fill an H100's or H200's tensor cores (16 GFLOP per product,
  // about 1.4 ms at 800 TFLOP/s); random operands, since zeros run faster than real data.
  const int n = 8192;
  const long numel = static_cast<long>(n) * n;
  MatmulBench m(n, dtype_size(precision));
  cu::fill_uniform(m.a, precision, numel, 1, m.stream);
  cu::fill_uniform(m.b, precision, numel, 2, m.stream);
  // As the model's matmuls: tensor cores, fp32 accumulation, the 16-bit result rounded once.
  STRATA_CHECK_CUBLAS(cublasSetMathMode(
      m.h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  const cudaDataType_t ty = cuda_type(precision);
  const float one = 1.0f, zero = 0.0f;
  return best_matmul_rate(
      [&] {
        STRATA_CHECK_CUBLAS(cublasGemmEx(m.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, m.a, ty, n, m.b, ty, n, &zero,
                                         m.c, ty, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      m.stream, n, seconds);
}


}  // namespace strata
