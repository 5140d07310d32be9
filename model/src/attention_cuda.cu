// Causal multi-head attention on the cuda backend, flash-style and simple: one block of
// 64 threads per (query or key tile, batch x head), one thread per row of the tile, an
// online softmax in forward, and backward recomputing the probabilities from the saved
// log-sum-exp. Per block no more than [64, 64] tiles of scores exist (shared memory), never
// the [T, T] matrix. Correctness over speed: rows of q, k, v are read from global memory
// and each thread accumulates its own output row there, so there are no races and no
// atomics. Same tiling and math as attention_cpu.cpp (scores in 64-key tiles, exp_approx).
//
// Compiled and linked in CI, never run there (no GPU); see kernels_cuda.hpp.
#include <cuda_runtime.h>

#include "kernels_cuda.hpp"

#include "strata/core/math/gpt.hpp"

namespace strata::detail::cuda {

namespace {

constexpr int kBlock = 64;  // query / key rows per tile

__device__ float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

// grid (query tiles, B*H), block kBlock: thread i owns query row blockIdx.x*kBlock + i.
__global__ void attention_forward_kernel(const float* qkv, float* out, float* lse, int T, int d, int H,
                                         float scale) {
  __shared__ float tile[kBlock][kBlock + 1];  // row i: query i's scores, then probabilities
  const int bh = blockIdx.y, b = bh / H, h = bh % H, hd = d / H;
  const int q = blockIdx.x * kBlock + threadIdx.x;
  if (q >= T) return;  // no barriers below: each thread works on its own row
  const long ld = 3L * d;
  const float* base = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const float* Q = base + q * ld;
  float* O = out + (static_cast<long>(b) * T + q) * d + static_cast<long>(h) * hd;
  float* s = tile[threadIdx.x];
  for (int c = 0; c < hd; ++c) O[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 <= q; k0 += kBlock) {  // keys 0 .. q are visible
    const int nk = min(kBlock, q - k0 + 1);
    float mx = m;
    for (int j = 0; j < nk; ++j) {
      s[j] = scale * dot(Q, base + d + (k0 + j) * ld, hd);
      mx = fmaxf(mx, s[j]);
    }
    const float corr = expf(m - mx);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
    for (int j = 0; j < nk; ++j) {
      s[j] = math::exp_approx(s[j] - mx);
      sum += s[j];
    }
    l = l * corr + sum;
    m = mx;
    const float* V = base + 2 * d + k0 * ld;
    for (int c = 0; c < hd; ++c) {
      float acc = O[c] * corr;
      for (int j = 0; j < nk; ++j) acc += s[j] * V[j * ld + c];
      O[c] = acc;
    }
  }
  const float inv = 1.0f / l;
  for (int c = 0; c < hd; ++c) O[c] *= inv;
  lse[static_cast<long>(bh) * T + q] = m + logf(l);
}

// dot[bh, t] = dout_t . out_t over the head's channels (the softmax backward's D).
__global__ void attention_dot_kernel(const float* out, const float* dout, float* dotp, int B, int T, int d, int H) {
  const int hd = d / H;
  const long n = static_cast<long>(B) * H * T;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long bh = i / T;
    const int t = static_cast<int>(i % T), b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const long off = (static_cast<long>(b) * T + t) * d + static_cast<long>(h) * hd;
    dotp[i] = dot(out + off, dout + off, hd);
  }
}

// dQ_q = scale sum_k P_qk (dO_q . V_k - D_q) K_k over k <= q. Thread i owns query row q.
__global__ void attention_dq_kernel(const float* qkv, const float* lse, const float* dout, const float* dotp,
                                    float* dqkv, int T, int d, int H, float scale) {
  __shared__ float tile[kBlock][kBlock + 1];  // row i: query i's dS over one key tile
  const int bh = blockIdx.y, b = bh / H, h = bh % H, hd = d / H;
  const int q = blockIdx.x * kBlock + threadIdx.x;
  if (q >= T) return;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const float* base = qkv + qoff;
  const float* Q = base + q * ld;
  const float* dO = dout + (static_cast<long>(b) * T + q) * d + static_cast<long>(h) * hd;
  const float L = lse[static_cast<long>(bh) * T + q], D = dotp[static_cast<long>(bh) * T + q];
  float* dQ = dqkv + qoff + q * ld;
  float* ds = tile[threadIdx.x];
  for (int c = 0; c < hd; ++c) dQ[c] = 0.0f;
  for (int k0 = 0; k0 <= q; k0 += kBlock) {
    const int nk = min(kBlock, q - k0 + 1);
    for (int j = 0; j < nk; ++j) {
      const float* K = base + d + (k0 + j) * ld;
      const float p = math::exp_approx(scale * dot(Q, K, hd) - L);
      ds[j] = p * (dot(dO, base + 2 * d + (k0 + j) * ld, hd) - D);
    }
    const float* K = base + d + k0 * ld;
    for (int c = 0; c < hd; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < nk; ++j) acc += ds[j] * K[j * ld + c];
      dQ[c] += scale * acc;
    }
  }
}

// dV_k = sum_q P_qk dO_q and dK_k = scale sum_q dS_qk Q_q over q >= k. Thread i owns key row k.
__global__ void attention_dkv_kernel(const float* qkv, const float* lse, const float* dout, const float* dotp,
                                     float* dqkv, int T, int d, int H, float scale) {
  __shared__ float ptile[kBlock][kBlock + 1];   // row i: P over one query tile for key i
  __shared__ float dstile[kBlock][kBlock + 1];  // row i: dS over the same tile
  const int bh = blockIdx.y, b = bh / H, h = bh % H, hd = d / H;
  const int k = blockIdx.x * kBlock + threadIdx.x;
  if (k >= T) return;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const float* base = qkv + qoff;
  const float* K = base + d + k * ld;
  const float* V = base + 2 * d + k * ld;
  const float* dObase = dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
  const float* L = lse + static_cast<long>(bh) * T;
  const float* D = dotp + static_cast<long>(bh) * T;
  float* dK = dqkv + qoff + d + k * ld;
  float* dV = dqkv + qoff + 2 * d + k * ld;
  float* p = ptile[threadIdx.x];
  float* ds = dstile[threadIdx.x];
  for (int c = 0; c < hd; ++c) dK[c] = dV[c] = 0.0f;
  for (int q0 = k; q0 < T; q0 += kBlock) {  // queries k .. T-1 see key k
    const int nq = min(kBlock, T - q0);
    for (int i = 0; i < nq; ++i) {
      const int q = q0 + i;
      p[i] = math::exp_approx(scale * dot(base + q * ld, K, hd) - L[q]);
      ds[i] = p[i] * (dot(dObase + static_cast<long>(q) * d, V, hd) - D[q]);
    }
    for (int c = 0; c < hd; ++c) {
      float av = 0.0f, ak = 0.0f;
      for (int i = 0; i < nq; ++i) {
        av += p[i] * dObase[static_cast<long>(q0 + i) * d + c];
        ak += ds[i] * base[(q0 + i) * ld + c];
      }
      dV[c] += av;
      dK[c] += scale * ak;
    }
  }
}

}  // namespace

void attention_forward(const float* qkv, float* out, float* lse, int B, int T, int d, int H, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(static_cast<float>(d / H));
  const dim3 grid((T + kBlock - 1) / kBlock, static_cast<unsigned>(B * H));
  attention_forward_kernel<<<grid, kBlock, 0, s>>>(qkv, out, lse, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv,
                        float* dotp, int B, int T, int d, int H, cudaStream_t s) {
  const float scale = 1.0f / sqrtf(static_cast<float>(d / H));
  const long n = static_cast<long>(B) * H * T;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535);
  attention_dot_kernel<<<blocks, 256, 0, s>>>(out, dout, dotp, B, T, d, H);
  STRATA_CHECK_CUDA(cudaGetLastError());
  const dim3 grid((T + kBlock - 1) / kBlock, static_cast<unsigned>(B * H));
  attention_dq_kernel<<<grid, kBlock, 0, s>>>(qkv, lse, dout, dotp, dqkv, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
  attention_dkv_kernel<<<grid, kBlock, 0, s>>>(qkv, lse, dout, dotp, dqkv, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

}  // namespace strata::detail::cuda
