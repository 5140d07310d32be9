// The GPT's element-wise, layer-norm, embedding and loss kernels on the cuda backend.
// Simple grid-stride loops, one block per row where a row is reduced. Compiled and linked
// in CI, never run there (no GPU); checked on an H100 (see kernels_cuda.hpp).
#include "kernels_cuda.hpp"

#include <cuda_runtime.h>

#include "strata/core/math/gpt.hpp"

namespace strata::detail::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(long n) {
  const long blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // part[] may still be read from a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += part[w];
  return t;
}

__device__ float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = part[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) t = fmaxf(t, part[w]);
  return t;
}

__global__ void embed_forward_kernel(const float* wte, const float* wpe, const int32_t* tok, float* x, long rows,
                                     int T, int d) {
  const long n = rows * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / d;
    const int c = static_cast<int>(i % d);
    x[i] = wte[static_cast<long>(tok[r]) * d + c] + wpe[(r % T) * d + c];
  }
}

__global__ void embed_backward_wte_kernel(const float* dres, const int32_t* tok, float* dwte, long rows, int d) {
  const long n = rows * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / d;
    const int c = static_cast<int>(i % d);
    atomicAdd(dwte + static_cast<long>(tok[r]) * d + c, dres[i]);
  }
}

// One thread per (t, c): a fixed order of additions, so dwpe is deterministic.
__global__ void embed_backward_wpe_kernel(const float* dres, float* dwpe, int B, int T, int d) {
  const long n = static_cast<long>(T) * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dres[static_cast<long>(b) * T * d + i];
    dwpe[i] = acc;
  }
}

// Two passes over the row, as math::layernorm_row (mean, then variance about it).
__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b, float* y, float* mean,
                                         float* rstd, int n) {
  const long r = blockIdx.x;
  const float* xr = x + r * n;
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float m = block_sum(s) / static_cast<float>(n);
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float c = xr[i] - m;
    v += c * c;
  }
  const float rs = 1.0f / sqrtf(block_sum(v) / static_cast<float>(n) + math::kLayerNormEps);
  float* yr = y + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - m) * rs * w[i] + b[i];
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w: math::layernorm_row_backward's dx.
__global__ void layernorm_backward_dx_kernel(const float* dy, const float* x, const float* w, const float* mean,
                                             const float* rstd, float* dx, int n) {
  const long r = blockIdx.x;
  const float m = mean[r], rs = rstd[r];
  const float* dyr = dy + r * n;
  const float* xr = x + r * n;
  float sg = 0.0f, sgx = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float g = dyr[i] * w[i];
    sg += g;
    sgx += g * (xr[i] - m) * rs;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float sum_g = block_sum(sg) * inv_n;
  const float sum_gx = block_sum(sgx) * inv_n;
  float* dxr = dx + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float xh = (xr[i] - m) * rs;
    dxr[i] += rs * (dyr[i] * w[i] - sum_g - xh * sum_gx);
  }
}

// One thread per column: dw = sum over rows of dy xhat, db = sum of dy (no atomics).
__global__ void layernorm_backward_params_kernel(const float* dy, const float* x, const float* mean,
                                                 const float* rstd, float* dw, float* db, long rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float aw = 0.0f, ab = 0.0f;
    for (long r = 0; r < rows; ++r) {
      const float g = dy[r * n + i];
      aw += g * (x[r * n + i] - mean[r]) * rstd[r];
      ab += g;
    }
    dw[i] = aw;
    db[i] = ab;
  }
}

__global__ void add_bias_rows_kernel(float* y, const float* bias, long rows, int n) {
  const long total = rows * n;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
    y[i] += bias[i % n];
}

__global__ void column_sums_kernel(const float* x, float* out, long rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (long r = 0; r < rows; ++r) acc += x[r * n + i];
    out[i] = acc;
  }
}

__global__ void add_into_kernel(float* y, const float* x, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] += x[i];
}

__global__ void gelu_forward_kernel(const float* in, float* out, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = math::gelu(in[i]);
}

__global__ void gelu_backward_kernel(float* grad, const float* in, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    grad[i] *= math::gelu_grad(in[i]);
}

// One block per row, as the cpu model: max, exp_approx(z - max) and its sum, then
// loss = log(sum) - (z_t - max); with backward, z becomes (softmax - onehot) * inv_n.
__global__ void cross_entropy_kernel(float* logits, const int32_t* targets, float* row_loss, int V, float inv_n,
                                     bool backward) {
  const long r = blockIdx.x;
  float* z = logits + r * V;
  const int tgt = targets[r];
  const float zt = z[tgt];  // read by every thread before any thread overwrites z
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx);  // its barriers also order the reads of z[tgt] before the writes below
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = math::exp_approx(z[j] - mx);
    if (backward) z[j] = p;
    s += p;
  }
  const float sum = block_sum(s);
  if (threadIdx.x == 0) row_loss[r] = logf(sum) - (zt - mx);
  if (!backward) return;
  const float k = inv_n / sum;
  for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] *= k;
  __syncthreads();
  if (threadIdx.x == 0) z[tgt] -= inv_n;
}

}  // namespace

void embed_forward(const float* wte, const float* wpe, const int32_t* tok, float* x, long rows, int T, int d,
                   cudaStream_t s) {
  embed_forward_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(wte, wpe, tok, x, rows, T, d);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void embed_backward(const float* dres, const int32_t* tok, float* dwte, float* dwpe, int B, int T, int d,
                    cudaStream_t s) {
  const long rows = static_cast<long>(B) * T;
  embed_backward_wte_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(dres, tok, dwte, rows, d);
  STRATA_CHECK_CUDA(cudaGetLastError());
  embed_backward_wpe_kernel<<<grid_for(static_cast<long>(T) * d), kThreads, 0, s>>>(dres, dwpe, B, T, d);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, long rows,
                       int n, cudaStream_t s) {
  if (rows <= 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, b, y, mean, rstd, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, long rows, int n, cudaStream_t s) {
  if (rows <= 0) return;
  layernorm_backward_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, w, mean, rstd, dx, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
  layernorm_backward_params_kernel<<<grid_for(n), kThreads, 0, s>>>(dy, x, mean, rstd, dw, db, rows, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void add_bias_rows(float* y, const float* bias, long rows, int n, cudaStream_t s) {
  add_bias_rows_kernel<<<grid_for(rows * n), kThreads, 0, s>>>(y, bias, rows, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void column_sums(const float* x, float* out, long rows, int n, cudaStream_t s) {
  column_sums_kernel<<<grid_for(n), kThreads, 0, s>>>(x, out, rows, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void add_into(float* y, const float* x, long n, cudaStream_t s) {
  add_into_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void gelu_forward(const float* in, float* out, long n, cudaStream_t s) {
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(in, out, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void gelu_backward(float* grad, const float* in, long n, cudaStream_t s) {
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(grad, in, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void cross_entropy_rows(float* logits, const int32_t* targets, float* row_loss, long rows, int V, float inv_n,
                        bool backward, cudaStream_t s) {
  if (rows <= 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, targets, row_loss, V, inv_n, backward);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

}  // namespace strata::detail::cuda
