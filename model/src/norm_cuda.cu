// The fused path's norm kernels (strata.cuda_kernels = "fused"; kernels_cuda.hpp): the
// same math as kernels_cuda.cu's LayerNorm and RMSNorm (core/math/gpt.hpp's rows, two
// passes for the variance), laid out for bandwidth. Forward and dx: one warp per row,
// NormPlan::rows_per_block rows per block, float4 loads where the row allows (n % 4 == 0;
// the buffers are 256-byte aligned, so every row is 16-byte aligned). The gains' (and
// bias') gradient: a [col_blocks, partial_blocks] grid, a thread per column summing a
// chunk of rows (consecutive threads read consecutive columns), each chunk's sums in its
// own row of an fp32 buffer; then one kernel sums each column's partial rows and stores
// the result once in the model's type. The reference kernels sum each column in one
// thread over every row, which leaves most of the GPU idle. Compiled in CI, NOT yet run
// on a GPU (docs/training.md).
#include "kernels_cuda.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "storage_cuda.cuh"
#include "strata/core/math/gpt.hpp"

namespace strata::detail::cuda {

namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Calls f(i, x[i]) for the lane's elements of a row of n: V at a time (V = 4: float4).
template <int V, class F>
__device__ __forceinline__ void each_of_row(const float* xr, int n, F&& f) {
  const int lane = threadIdx.x;
  if constexpr (V == 4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int j = lane; j < n / 4; j += 32) {
      const float4 v = x4[j];
      f(4 * j, v.x);
      f(4 * j + 1, v.y);
      f(4 * j + 2, v.z);
      f(4 * j + 3, v.w);
    }
  } else {
    for (int i = lane; i < n; i += 32) f(i, xr[i]);
  }
}

template <class S, int V>
__global__ void layernorm_rows_kernel(const float* x, const typename S::Bits* w, const typename S::Bits* b,
                                      typename S::Bits* y, float* mean, float* rstd, long rows, int n) {
  const long r = static_cast<long>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const float* xr = x + r * n;
  float s = 0.0f;
  each_of_row<V>(xr, n, [&](int, float v) { s += v; });
  const float m = warp_sum(s) / static_cast<float>(n);
  float q = 0.0f;
  each_of_row<V>(xr, n, [&](int, float v) { q += (v - m) * (v - m); });
  const float rs = 1.0f / sqrtf(warp_sum(q) / static_cast<float>(n) + math::kLayerNormEps);
  typename S::Bits* yr = y + r * n;
  each_of_row<V>(xr, n, [&](int i, float v) { yr[i] = S::store((v - m) * rs * S::load(w[i]) + S::load(b[i])); });
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <class S, int V>
__global__ void rmsnorm_rows_kernel(const float* x, const typename S::Bits* w, typename S::Bits* y, float* rstd,
                                    long rows, int n, float eps) {
  const long r = static_cast<long>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const float* xr = x + r * n;
  float q = 0.0f;
  each_of_row<V>(xr, n, [&](int, float v) { q += v * v; });
  const float rs = 1.0f / sqrtf(warp_sum(q) / static_cast<float>(n) + eps);
  typename S::Bits* yr = y + r * n;
  each_of_row<V>(xr, n, [&](int i, float v) { yr[i] = S::store(S::load(w[i]) * (v * rs)); });
  if (threadIdx.x == 0) rstd[r] = rs;
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w; RMSNorm (mean null): no mean(g)
// term and xhat = x rstd.
template <class S, int V>
__global__ void norm_dx_rows_kernel(const float* dy, const float* x, const typename S::Bits* w, const float* mean,
                                    const float* rstd, float* dx, long rows, int n) {
  const long r = static_cast<long>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const float m = mean ? mean[r] : 0.0f, rs = rstd[r];
  const float* dyr = dy + r * n;
  const float* xr = x + r * n;
  float sg = 0.0f, sgx = 0.0f;
  each_of_row<V>(xr, n, [&](int i, float v) {
    const float g = dyr[i] * S::load(w[i]);
    sg += g;
    sgx += g * (v - m) * rs;
  });
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mg = mean ? warp_sum(sg) * inv_n : 0.0f;
  const float mgx = warp_sum(sgx) * inv_n;
  float* dxr = dx + r * n;
  each_of_row<V>(xr, n, [&](int i, float v) {
    dxr[i] += rs * (dyr[i] * S::load(w[i]) - mg - (v - m) * rs * mgx);
  });
}

// Chunk blockIdx.y's sums of dy xhat (and dy, with db_part) for the block's columns.
__global__ void norm_params_partial_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                           float* dw_part, float* db_part, long rows, int n, long rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const long r0 = static_cast<long>(blockIdx.y) * rows_per_chunk;
  const long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float aw = 0.0f, ab = 0.0f;
  for (long r = r0; r < r1; ++r) {
    const float g = dy[r * n + c];
    aw += g * (x[r * n + c] - (mean ? mean[r] : 0.0f)) * rstd[r];
    ab += g;
  }
  dw_part[static_cast<long>(blockIdx.y) * n + c] = aw;
  if (db_part) db_part[static_cast<long>(blockIdx.y) * n + c] = ab;
}

// Chunk blockIdx.y's column sums of x, for the block's columns (a bias gradient's).
__global__ void column_partial_kernel(const float* x, float* part, long rows, int n, long rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const long r0 = static_cast<long>(blockIdx.y) * rows_per_chunk;
  const long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float a = 0.0f;
  for (long r = r0; r < r1; ++r) a += x[r * n + c];
  part[static_cast<long>(blockIdx.y) * n + c] = a;
}

// out[c] = sum of part[p][c] over the chunks p, stored once as S.
template <class S>
__global__ void column_reduce_kernel(const float* part, typename S::Bits* out, long chunks, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float acc = 0.0f;
  for (long p = 0; p < chunks; ++p) acc += part[p * n + c];
  out[c] = S::store(acc);
}

template <class S>
__global__ void gelu_backward_typed_kernel(float* grad, const typename S::Bits* pre, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    grad[i] *= math::gelu_grad(S::load(pre[i]));
}

dim3 row_block(const NormPlan& p) { return dim3(32, static_cast<unsigned>(p.rows_per_block)); }

// Calls f(std::integral_constant<int, V>) for the plan's vector width; 1 where x is not
// 16-byte aligned (a row of a buffer the model did not carve, e.g. a checkpoint store's).
template <class F>
void with_vec(const NormPlan& p, const float* x, F&& f) {
  if (p.vec == 4 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 1>{});
}

// The gains' (and bias') gradient of a norm, through the partial buffer.
template <class S>
void norm_params(const float* dy, const float* x, const float* mean, const float* rstd, void* dw, void* db,
                 float* partials, long rows, int n, const NormPlan& p, cudaStream_t s) {
  float* db_part = db ? partials + p.partial_blocks * static_cast<long>(n) : nullptr;
  const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.partial_blocks));
  norm_params_partial_kernel<<<grid, p.col_tile, 0, s>>>(dy, x, mean, rstd, partials, db_part, rows, n,
                                                         p.rows_per_partial);
  STRATA_CHECK_CUDA(cudaGetLastError());
  const unsigned cols = static_cast<unsigned>(p.col_blocks);
  column_reduce_kernel<S><<<cols, p.col_tile, 0, s>>>(partials, as<S>(dw), p.partial_blocks, n);
  if (db) column_reduce_kernel<S><<<cols, p.col_tile, 0, s>>>(db_part, as<S>(db), p.partial_blocks, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

void layernorm_forward_rows(const float* x, const void* w, const void* b, DType t, void* y, float* mean, float* rstd,
                            long rows, int n, const NormPlan& p, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_vec(p, x, [&](auto v) {
      layernorm_rows_kernel<S, decltype(v)::value><<<static_cast<unsigned>(p.blocks), row_block(p), 0, s>>>(
          x, as<S>(w), as<S>(b), as<S>(y), mean, rstd, rows, n);
    });
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void layernorm_backward_rows(const float* dy, const float* x, const void* w, DType t, const float* mean,
                             const float* rstd, float* dx, void* dw, void* db, float* partials, long rows, int n,
                             const NormPlan& p, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_vec(p, x, [&](auto v) {
      norm_dx_rows_kernel<S, decltype(v)::value>
          <<<static_cast<unsigned>(p.blocks), row_block(p), 0, s>>>(dy, x, as<S>(w), mean, rstd, dx, rows, n);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
    norm_params<S>(dy, x, mean, rstd, dw, db, partials, rows, n, p, s);
  });
}

void rmsnorm_forward_rows(const float* x, const void* w, DType t, void* y, float* rstd, long rows, int n, float eps,
                          const NormPlan& p, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_vec(p, x, [&](auto v) {
      rmsnorm_rows_kernel<S, decltype(v)::value>
          <<<static_cast<unsigned>(p.blocks), row_block(p), 0, s>>>(x, as<S>(w), as<S>(y), rstd, rows, n, eps);
    });
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void rmsnorm_backward_rows(const float* dy, const float* x, const void* w, DType t, const float* rstd, float* dx,
                           void* dw, float* partials, long rows, int n, const NormPlan& p, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_vec(p, x, [&](auto v) {
      norm_dx_rows_kernel<S, decltype(v)::value>
          <<<static_cast<unsigned>(p.blocks), row_block(p), 0, s>>>(dy, x, as<S>(w), nullptr, rstd, dx, rows, n);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
    norm_params<S>(dy, x, nullptr, rstd, dw, nullptr, partials, rows, n, p, s);
  });
}

void column_sums_rows(const float* x, void* out, DType t, float* partials, long rows, int n, const NormPlan& p,
                      cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.partial_blocks));
  column_partial_kernel<<<grid, p.col_tile, 0, s>>>(x, partials, rows, n, p.rows_per_partial);
  STRATA_CHECK_CUDA(cudaGetLastError());
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    column_reduce_kernel<S><<<static_cast<unsigned>(p.col_blocks), p.col_tile, 0, s>>>(partials, as<S>(out),
                                                                                        p.partial_blocks, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void gelu_backward_typed(float* grad, const void* pre, DType t, long n, cudaStream_t s) {
  if (n <= 0) return;
  const long blocks = (n + 255) / 256;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    gelu_backward_typed_kernel<S><<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(
        grad, as<S>(pre), n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

int multiprocessors() {
  int dev = 0, sms = 0;
  STRATA_CHECK_CUDA(cudaGetDevice(&dev));
  STRATA_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

}  // namespace strata::detail::cuda
