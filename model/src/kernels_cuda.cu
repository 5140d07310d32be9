// The GPT's element-wise, layer-norm, embedding and loss kernels on the cuda backend.
// Simple grid-stride loops, one block per row where a row is reduced. Each kernel is
// templated on the storage type of its typed operands (storage_cuda.cuh) and computes in
// fp32. Compiled and linked in CI, never run there (no GPU); the fp32 instances were
// checked on an H100, the fp32, bf16 and fp16 ones on an H200 (see kernels_cuda.hpp).
#include "kernels_cuda.hpp"

#include <cuda_runtime.h>

#include "storage_cuda.cuh"
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

template <class S>
__global__ void embed_forward_kernel(const typename S::Bits* wte, const typename S::Bits* wpe, const int32_t* tok,
                                     float* x, long rows, int T, int d) {
  const long n = rows * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / d;
    const int c = static_cast<int>(i % d);
    const float e = S::load(wte[static_cast<long>(tok[r]) * d + c]);
    x[i] = wpe ? e + S::load(wpe[(r % T) * d + c]) : e;  // no wpe: Llama (rotary positions)
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
template <class S>
__global__ void embed_backward_wpe_kernel(const float* dres, typename S::Bits* dwpe, int B, int T, int d) {
  const long n = static_cast<long>(T) * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dres[static_cast<long>(b) * T * d + i];
    dwpe[i] = S::store(acc);
  }
}

// Two passes over the row, as math::layernorm_row (mean, then variance about it).
template <class S>
__global__ void layernorm_forward_kernel(const float* x, const typename S::Bits* w, const typename S::Bits* b,
                                         typename S::Bits* y, float* mean, float* rstd, int n) {
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
  typename S::Bits* yr = y + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = S::store((xr[i] - m) * rs * S::load(w[i]) + S::load(b[i]));
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w: math::layernorm_row_backward's dx.
template <class S>
__global__ void layernorm_backward_dx_kernel(const float* dy, const float* x, const typename S::Bits* w,
                                             const float* mean, const float* rstd, float* dx, int n) {
  const long r = blockIdx.x;
  const float m = mean[r], rs = rstd[r];
  const float* dyr = dy + r * n;
  const float* xr = x + r * n;
  float sg = 0.0f, sgx = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float g = dyr[i] * S::load(w[i]);
    sg += g;
    sgx += g * (xr[i] - m) * rs;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float sum_g = block_sum(sg) * inv_n;
  const float sum_gx = block_sum(sgx) * inv_n;
  float* dxr = dx + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float xh = (xr[i] - m) * rs;
    dxr[i] += rs * (dyr[i] * S::load(w[i]) - sum_g - xh * sum_gx);
  }
}

// One thread per column: dw = sum over rows of dy xhat, db = sum of dy (no atomics), in
// fp32, stored once.
template <class S>
__global__ void layernorm_backward_params_kernel(const float* dy, const float* x, const float* mean,
                                                 const float* rstd, typename S::Bits* dw, typename S::Bits* db,
                                                 long rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float aw = 0.0f, ab = 0.0f;
    for (long r = 0; r < rows; ++r) {
      const float g = dy[r * n + i];
      aw += g * (x[r * n + i] - mean[r]) * rstd[r];
      ab += g;
    }
    dw[i] = S::store(aw);
    db[i] = S::store(ab);
  }
}

// out[i] = O(y[i] + bias[i % n]); out may be y (O = F32: in place).
template <class S, class O>
__global__ void add_bias_rows_kernel(const float* y, const typename S::Bits* bias, typename O::Bits* out, long rows,
                                     int n) {
  const long total = rows * n;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
    out[i] = O::store(y[i] + S::load(bias[i % n]));
}

template <class S>
__global__ void column_sums_kernel(const float* x, typename S::Bits* out, long rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (long r = 0; r < rows; ++r) acc += x[r * n + i];
    out[i] = S::store(acc);
  }
}

__global__ void add_into_kernel(float* y, const float* x, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] += x[i];
}

template <class S>
__global__ void round_to_kernel(const float* src, typename S::Bits* dst, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = S::store(src[i]);
}

template <class S>
__global__ void gelu_forward_kernel(const float* in, typename S::Bits* out, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = S::store(math::gelu(in[i]));
}

__global__ void gelu_backward_kernel(float* grad, const float* in, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    grad[i] *= math::gelu_grad(in[i]);
}

// One block per row, as the cpu model: max, exp_approx(z - max) and its sum, then
// loss = log(sum) - (z_t - max); with grad, (softmax - onehot) * inv_n stored as S. The
// products are rounded before the subtraction (__fmul_rn: no fused multiply-add), as
// the cpu model scales, then subtracts. grad may alias z (each thread rewrites only
// the elements it read).
template <class S>
__global__ void cross_entropy_kernel(float* logits, const int32_t* targets, float* row_loss, int V, float inv_n,
                                     typename S::Bits* grad, long grad_ld) {
  const long r = blockIdx.x;
  float* z = logits + r * V;
  const int tgt = targets[r];
  const float zt = z[tgt];  // read by every thread before any thread overwrites z
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx);  // its barriers also order the reads of z[tgt] before the writes below
  const bool backward = grad != nullptr;
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
  typename S::Bits* g = grad + r * grad_ld;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = __fmul_rn(z[j], k);
    g[j] = S::store(j == tgt ? p - inv_n : p);
  }
}

// ---- Llama ------------------------------------------------------------------------

// y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps): math::rmsnorm_row, one block per row.
template <class S>
__global__ void rmsnorm_forward_kernel(const float* x, const typename S::Bits* w, typename S::Bits* y, float* rstd,
                                       int n, float eps) {
  const long r = blockIdx.x;
  const float* xr = x + r * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float rs = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  typename S::Bits* yr = y + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = S::store(S::load(w[i]) * (xr[i] * rs));
  if (threadIdx.x == 0) rstd[r] = rs;
}

// dx += rstd (g - xhat mean(g xhat)), g = dy w: math::rmsnorm_row_backward's dx.
template <class S>
__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const typename S::Bits* w,
                                           const float* rstd, float* dx, int n) {
  const long r = blockIdx.x;
  const float rs = rstd[r];
  const float* dyr = dy + r * n;
  const float* xr = x + r * n;
  float sgx = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sgx += dyr[i] * S::load(w[i]) * (xr[i] * rs);
  const float m = block_sum(sgx) / static_cast<float>(n);
  float* dxr = dx + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dxr[i] += rs * (dyr[i] * S::load(w[i]) - xr[i] * rs * m);
}

// One thread per column: dw = sum over rows of dy xhat in fp32, stored once.
template <class S>
__global__ void rmsnorm_backward_w_kernel(const float* dy, const float* x, const float* rstd, typename S::Bits* dw,
                                          long rows, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (long r = 0; r < rows; ++r) acc += dy[r * n + i] * (x[r * n + i] * rstd[r]);
    dw[i] = S::store(acc);
  }
}

// One thread per element of out [rows, 3d]: q and k rotated at the row's position
// (rotate-half: channel j pairs with j + hd/2), k and v of kv head h / rep for head h.
template <class S>
__global__ void rope_expand_kernel(const float* p, const float* cosv, const float* sinv, typename S::Bits* out,
                                   long rows, int T, int d, int hd, int kvd, int rep) {
  const int h2 = hd / 2, pw = d + 2 * kvd;
  const long n = rows * 3 * d;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / (3 * d);
    const int c = static_cast<int>(i % (3 * d)), part = c / d, h = (c % d) / hd, j = c % hd;
    const float* pr = p + r * pw;
    float v;
    if (part == 2) {
      v = pr[d + kvd + (h / rep) * hd + j];
    } else {
      const float* x = part == 0 ? pr + h * hd : pr + d + (h / rep) * hd;
      const int k = j < h2 ? j : j - h2;
      const float cs = cosv[(r % T) * h2 + k], sn = sinv[(r % T) * h2 + k];
      v = j < h2 ? x[k] * cs - x[k + h2] * sn : x[k + h2] * cs + x[k] * sn;
    }
    out[i] = S::store(v);
  }
}

// One thread per element of dp [rows, d + 2 kvd]: q's gradient rotated back; k's and v's
// summed over the rep heads that share the kv head (a fixed order: deterministic).
__global__ void rope_reduce_kernel(const float* g, const float* cosv, const float* sinv, float* dp, long rows, int T,
                                   int d, int hd, int kvd, int rep) {
  const int h2 = hd / 2, pw = d + 2 * kvd;
  const long n = rows * pw;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / pw;
    const int c = static_cast<int>(i % pw);
    const float* gr = g + r * 3 * d;
    const int j = (c < d ? c : (c - d) % kvd) % hd;
    const int k = j < h2 ? j : j - h2;
    const float cs = cosv[(r % T) * h2 + k], sn = sinv[(r % T) * h2 + k];
    // The transpose of the rotation: (x_k cs + x_{k+h2} sn, x_{k+h2} cs - x_k sn).
    auto unrotate = [&](const float* x) { return j < h2 ? x[k] * cs + x[k + h2] * sn : x[k + h2] * cs - x[k] * sn; };
    float v = 0.0f;
    if (c < d) {
      v = unrotate(gr + (c / hd) * hd);
    } else if (c < d + kvd) {
      const int kv = (c - d) / hd;
      for (int h = kv * rep; h < (kv + 1) * rep; ++h) v += unrotate(gr + d + h * hd);
    } else {
      const int kv = (c - d - kvd) / hd;
      for (int h = kv * rep; h < (kv + 1) * rep; ++h) v += gr[2 * d + h * hd + j];
    }
    dp[i] = v;
  }
}

// out[r, j] = silu(gate) * up over gu [rows, 2f] = [gate, up].
template <class S>
__global__ void swiglu_forward_kernel(const float* gu, typename S::Bits* out, long rows, int f) {
  const long n = rows * f;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / f;
    const int j = static_cast<int>(i % f);
    out[i] = S::store(math::silu(gu[r * 2 * f + j]) * gu[r * 2 * f + f + j]);
  }
}

__global__ void swiglu_backward_kernel(const float* dout, const float* gu, float* dgu, long rows, int f) {
  const long n = rows * f;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long r = i / f;
    const int j = static_cast<int>(i % f);
    const float g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j], dz = dout[i];
    dgu[r * 2 * f + j] = dz * u * math::silu_grad(g);
    dgu[r * 2 * f + f + j] = dz * math::silu(g);
  }
}

// splitmix64's finaliser of (seed, i): 24 random bits to [-1, 1).
template <class S>
__global__ void fill_uniform_kernel(typename S::Bits* p, long n, uint32_t seed) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint64_t z = (static_cast<uint64_t>(seed) << 32) + static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = S::store(static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

}  // namespace

void embed_forward(const void* wte, const void* wpe, DType t, const int32_t* tok, float* x, long rows, int T, int d,
                   cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    embed_forward_kernel<S><<<grid_for(rows * d), kThreads, 0, s>>>(as<S>(wte), as<S>(wpe), tok, x, rows, T, d);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void embed_backward(const float* dres, const int32_t* tok, float* dwte, void* dwpe, DType t, int B, int T, int d,
                    cudaStream_t s) {
  const long rows = static_cast<long>(B) * T;
  embed_backward_wte_kernel<<<grid_for(rows * d), kThreads, 0, s>>>(dres, tok, dwte, rows, d);
  STRATA_CHECK_CUDA(cudaGetLastError());
  if (!dwpe) return;  // Llama: no position table
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    embed_backward_wpe_kernel<S><<<grid_for(static_cast<long>(T) * d), kThreads, 0, s>>>(dres, as<S>(dwpe), B, T, d);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void layernorm_forward(const float* x, const void* w, const void* b, DType t, void* y, float* mean, float* rstd,
                       long rows, int n, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    layernorm_forward_kernel<S>
        <<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, as<S>(w), as<S>(b), as<S>(y), mean, rstd, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void layernorm_backward(const float* dy, const float* x, const void* w, DType t, const float* mean, const float* rstd,
                        float* dx, void* dw, void* db, long rows, int n, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    layernorm_backward_dx_kernel<S><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, as<S>(w), mean, rstd, dx, n);
    STRATA_CHECK_CUDA(cudaGetLastError());
    layernorm_backward_params_kernel<S>
        <<<grid_for(n), kThreads, 0, s>>>(dy, x, mean, rstd, as<S>(dw), as<S>(db), rows, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void add_bias_rows(float* y, const void* bias, DType t, long rows, int n, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    add_bias_rows_kernel<S, F32S><<<grid_for(rows * n), kThreads, 0, s>>>(y, as<S>(bias), y, rows, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void add_bias_rows_to(const float* y, const void* bias, DType t, void* out, long rows, int n, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    add_bias_rows_kernel<S, S><<<grid_for(rows * n), kThreads, 0, s>>>(y, as<S>(bias), as<S>(out), rows, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void column_sums(const float* x, void* out, DType t, long rows, int n, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    column_sums_kernel<S><<<grid_for(n), kThreads, 0, s>>>(x, as<S>(out), rows, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void add_into(float* y, const float* x, long n, cudaStream_t s) {
  add_into_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void round_to(const float* src, void* dst, DType t, long n, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    round_to_kernel<S><<<grid_for(n), kThreads, 0, s>>>(src, as<S>(dst), n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void gelu_forward(const float* in, void* out, DType t, long n, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    gelu_forward_kernel<S><<<grid_for(n), kThreads, 0, s>>>(in, as<S>(out), n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void gelu_backward(float* grad, const float* in, long n, cudaStream_t s) {
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(grad, in, n);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void cross_entropy_rows(float* logits, const int32_t* targets, float* row_loss, long rows, int V, float inv_n,
                        void* grad, DType t, long grad_ld, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    cross_entropy_kernel<S>
        <<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, targets, row_loss, V, inv_n, as<S>(grad), grad_ld);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void rmsnorm_forward(const float* x, const void* w, DType t, void* y, float* rstd, long rows, int n, float eps,
                     cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    rmsnorm_forward_kernel<S><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, as<S>(w), as<S>(y), rstd, n, eps);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void rmsnorm_backward(const float* dy, const float* x, const void* w, DType t, const float* rstd, float* dx, void* dw,
                      long rows, int n, cudaStream_t s) {
  if (rows <= 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    rmsnorm_backward_dx_kernel<S><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, as<S>(w), rstd, dx, n);
    STRATA_CHECK_CUDA(cudaGetLastError());
    rmsnorm_backward_w_kernel<S><<<grid_for(n), kThreads, 0, s>>>(dy, x, rstd, as<S>(dw), rows, n);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void rope_expand(const float* p, const float* cosv, const float* sinv, void* qkv, DType t, long rows, int T, int d,
                 int heads, int kv_heads, cudaStream_t s) {
  const int hd = d / heads;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    rope_expand_kernel<S><<<grid_for(rows * 3 * d), kThreads, 0, s>>>(p, cosv, sinv, as<S>(qkv), rows, T, d, hd,
                                                                      kv_heads * hd, heads / kv_heads);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void rope_reduce(const float* dqkv, const float* cosv, const float* sinv, float* dp, long rows, int T, int d,
                 int heads, int kv_heads, cudaStream_t s) {
  const int hd = d / heads;
  rope_reduce_kernel<<<grid_for(rows * (d + 2L * kv_heads * hd)), kThreads, 0, s>>>(dqkv, cosv, sinv, dp, rows, T, d,
                                                                                     hd, kv_heads * hd,
                                                                                     heads / kv_heads);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void swiglu_forward(const float* gu, void* out, DType t, long rows, int f, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    swiglu_forward_kernel<S><<<grid_for(rows * f), kThreads, 0, s>>>(gu, as<S>(out), rows, f);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void swiglu_backward(const float* dout, const float* gu, float* dgu, long rows, int f, cudaStream_t s) {
  swiglu_backward_kernel<<<grid_for(rows * f), kThreads, 0, s>>>(dout, gu, dgu, rows, f);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void fill_uniform(void* p, DType t, long n, uint32_t seed, cudaStream_t s) {
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    fill_uniform_kernel<S><<<grid_for(n), kThreads, 0, s>>>(as<S>(p), n, seed);
  });
  STRATA_CHECK_CUDA(cudaGetLastError());
}

}  // namespace strata::detail::cuda
