// Causal multi-head attention on the cuda backend, flash-style (FlashAttention-2's loop
// order, fp32 on the CUDA cores; q, k, v, the output and its gradient stored as the
// model's precision S and converted to fp32 as tiles are staged, storage_cuda.cuh): one block of 256 threads per (query or key tile,
// batch x head). A block stages its tile of q (or k, v) and each visiting tile of k, v
// (or q, dout) in shared memory, coalesced; the [BT, BT] tile of scores lives in
// registers and shared memory, never the [T, T] matrix. Forward keeps an online softmax
// and the log-sum-exp; backward recomputes the probabilities from it: one kernel
// accumulates dq per query tile, one dk and dv per key tile, so no atomics and no races.
//
// Thread (ty, tx) = (tid / 16, tid % 16) owns tile rows ty + 16 i and columns tx + 16 j;
// a row's 16 owners are lanes of one warp, so row max and sum are warp shuffles. BT is 64,
// or 32 where a 64-row tile's shared memory exceeds the GPU's per-block limit (large head
// dimensions); attention_tile() says which, or that none fits.
//
// The math is attention_cpu.cpp's: scores scaled by 1/sqrt(head_dim), probabilities by
// exp_approx, the online-softmax correction by expf; masked scores are exactly 0.
// Statistics (running max, sum, log-sum-exp) are fp32; dq, dk, dv are written fp32. In
// 16 bits the kernels round where docs/mixed-precision.md says: the normalised
// probabilities P before P V and P^T dO, dS before dS K and dS^T Q, the output once when
// stored. P normalised needs the row's log-sum-exp before any P V term, so the 16-bit
// forward takes two passes over the key tiles (the first only for max and sum); fp32 keeps
// the one-pass online softmax, bit for bit the kernel that ran on the H100.
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "kernels_cuda.hpp"
#include "storage_cuda.cuh"

#include "strata/core/math/gpt.hpp"

namespace strata::detail::cuda {

namespace {

constexpr int kThreads = 256;

// Shared floats per block for a tile of BT rows and head dimension hd (pitch hd + 1, so
// 16 threads reading 16 rows at one column hit 16 banks).
size_t forward_floats(int bt, int hd) { return 3ul * bt * (hd + 1) + bt * (bt + 1ul) + 1ul * bt * hd; }
size_t dq_floats(int bt, int hd) { return 4ul * bt * (hd + 1) + bt * (bt + 1ul) + 1ul * bt * hd; }
size_t dkv_floats(int bt, int hd) { return 4ul * bt * (hd + 1) + 2ul * bt * (bt + 1) + 2ul * bt * hd + 2ul * bt; }
size_t most_floats(int bt, int hd) {
  size_t m = forward_floats(bt, hd);
  if (dq_floats(bt, hd) > m) m = dq_floats(bt, hd);
  if (dkv_floats(bt, hd) > m) m = dkv_floats(bt, hd);
  return m;
}

// Copies rows t0 .. t0+BT-1 (zeros past T) of a [T, ld]-strided head slice of type S
// into a [BT, hd + 1] fp32 tile.
template <int BT, class S>
__device__ void load_tile(float* tile, const typename S::Bits* src, long ld, int t0, int T, int hd) {
  const int pitch = hd + 1;
  for (int i = threadIdx.x; i < BT * hd; i += kThreads) {
    const int r = i / hd, c = i - r * hd;
    tile[r * pitch + c] = t0 + r < T ? S::load(src[static_cast<long>(t0 + r) * ld + c]) : 0.0f;
  }
}

__device__ float dot_rows(const float* a, const float* b, int hd) {
  float acc = 0.0f;
#pragma unroll 4
  for (int c = 0; c < hd; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

// Reductions over the 16 lanes that own one row.
__device__ float row_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 16));
  return v;
}
__device__ float row_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, 16);
  return v;
}

// Scores of row q (its q tile row at qrow) against key tile k0: s[j] for the thread's
// columns tx + 16 j, -inf where masked; returns the row's max over them and mx (all 16
// lanes of the row take part).
template <int R>
__device__ float tile_scores(const float* qrow, const float* Ks, int pitch, int hd, int k0, int q, int tx,
                             float scale, float (&s)[R], float mx) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int k = k0 + tx + 16 * j;
    s[j] = k <= q ? scale * dot_rows(qrow, Ks + (tx + 16 * j) * pitch, hd) : -INFINITY;
    mx = fmaxf(mx, s[j]);
  }
  return row_max(mx);
}

// One key tile of the online softmax for a row: adds exp(s - mx) to the row's sum l
// (rescaled from the old max m), moves m to mx, writes the terms to prow[tx + 16 j]
// when prow is given; returns the rescale factor exp(m_old - mx) (0 on the first tile).
template <int R>
__device__ float online_softmax_tile(const float (&s)[R], float mx, float& m, float& l, float* prow, int tx) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const float p = s[j] == -INFINITY ? 0.0f : math::exp_approx(s[j] - mx);
    if (prow) prow[tx + 16 * j] = p;
    sum += p;
  }
  const float corr = expf(m - mx);
  l = l * corr + row_sum(sum);
  m = mx;
  return corr;
}

// grid (query tiles, B*H). out [B*T, d], lse [B*H, T].
template <int BT, class S>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const typename S::Bits* qkv, typename S::Bits* out, float* lse, int T, int d, int H,
                             float scale) {
  constexpr int R = BT / 16;  // rows (and columns) per thread
  extern __shared__ float smem[];
  const int hd = d / H, pitch = hd + 1;
  float* Qs = smem;
  float* Ks = Qs + BT * pitch;
  float* Vs = Ks + BT * pitch;
  float* Ps = Vs + BT * pitch;  // [BT, BT + 1]
  float* Os = Ps + BT * (BT + 1);  // [BT, hd]
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int q0 = blockIdx.x * BT, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const long ld = 3L * d;
  const typename S::Bits* base = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;

  load_tile<BT, S>(Qs, base, ld, q0, T, hd);
  for (int i = threadIdx.x; i < BT * hd; i += kThreads) Os[i] = 0.0f;
  float m[R], l[R];
#pragma unroll
  for (int i = 0; i < R; ++i) m[i] = -INFINITY, l[i] = 0.0f;

  // 16 bits: a first pass for each row's max and sum, so that the second rounds P
  // normalised (exp(s - lse)), whatever the tiling; fp32 takes the online pass alone.
  constexpr bool kRoundP = !std::is_same_v<S, F32S>;
  float lse_row[R];
  if constexpr (kRoundP) {
    for (int k0 = 0; k0 <= q0 && k0 < T; k0 += BT) {
      __syncthreads();  // the previous tile's Ks is no longer read
      load_tile<BT, S>(Ks, base + d, ld, k0, T, hd);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int r = ty + 16 * i;
        float s[R];
        const float mx = tile_scores<R>(Qs + r * pitch, Ks, pitch, hd, k0, q0 + r, tx, scale, s, m[i]);
        online_softmax_tile<R>(s, mx, m[i], l[i], nullptr, tx);
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) lse_row[i] = m[i] + logf(l[i]);
  }

  for (int k0 = 0; k0 <= q0 && k0 < T; k0 += BT) {  // key tiles up to the diagonal
    __syncthreads();  // the previous tile's Ks, Vs, Ps are no longer read
    load_tile<BT, S>(Ks, base + d, ld, k0, T, hd);
    load_tile<BT, S>(Vs, base + 2 * d, ld, k0, T, hd);
    __syncthreads();
    float corr[R];
    if constexpr (kRoundP) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int r = ty + 16 * i;
        float s[R];
        tile_scores<R>(Qs + r * pitch, Ks, pitch, hd, k0, q0 + r, tx, scale, s, m[i]);
#pragma unroll
        for (int j = 0; j < R; ++j)  // round(P), P = exp(s - lse) normalised
          Ps[r * (BT + 1) + tx + 16 * j] = s[j] == -INFINITY ? 0.0f : S::load(S::store(math::exp_approx(s[j] - lse_row[i])));
        corr[i] = 1.0f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int r = ty + 16 * i;
        float s[R];
        // finite: key k0 <= q is visible to every row
        const float mx = tile_scores<R>(Qs + r * pitch, Ks, pitch, hd, k0, q0 + r, tx, scale, s, m[i]);
        corr[i] = online_softmax_tile<R>(s, mx, m[i], l[i], Ps + r * (BT + 1), tx);  // 0 on the first tile
      }
    }
    __syncthreads();  // Ps complete
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = ty + 16 * i;
      const float* p = Ps + r * (BT + 1);
      for (int c = tx; c < hd; c += 16) {
        float acc = Os[r * hd + c] * corr[i];
#pragma unroll 8
        for (int j = 0; j < BT; ++j) acc = fmaf(p[j], Vs[j * pitch + c], acc);
        Os[r * hd + c] = acc;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = ty + 16 * i, q = q0 + r;
    if (q >= T) continue;
    const float inv = kRoundP ? 1.0f : 1.0f / l[i];  // 16 bits: P was normalised already
    typename S::Bits* O = out + (static_cast<long>(b) * T + q) * d + static_cast<long>(h) * hd;
    for (int c = tx; c < hd; c += 16) O[c] = S::store(Os[r * hd + c] * inv);
    if (tx == 0) lse[static_cast<long>(bh) * T + q] = kRoundP ? lse_row[i] : m[i] + logf(l[i]);
  }
}

// dot[bh, t] = dout_t . out_t over the head's channels (the softmax backward's D), fp32.
template <class S>
__global__ void attention_dot_kernel(const typename S::Bits* out, const typename S::Bits* dout, float* dotp, int B,
                                     int T, int d, int H) {
  const int hd = d / H;
  const long n = static_cast<long>(B) * H * T;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const long bh = i / T;
    const int t = static_cast<int>(i % T), b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const long off = (static_cast<long>(b) * T + t) * d + static_cast<long>(h) * hd;
    float acc = 0.0f;  // dot_rows over the converted values
#pragma unroll 4
    for (int c = 0; c < hd; ++c) acc = fmaf(S::load(out[off + c]), S::load(dout[off + c]), acc);
    dotp[i] = acc;
  }
}

// dQ_q = scale sum_{k <= q} dS_qk K_k, dS_qk = P_qk (dO_q . V_k - D_q). grid (query tiles, B*H).
template <int BT, class S>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const typename S::Bits* qkv, const float* lse, const typename S::Bits* dout,
                        const float* dotp, float* dqkv, int T, int d, int H, float scale) {
  constexpr int R = BT / 16;
  extern __shared__ float smem[];
  const int hd = d / H, pitch = hd + 1;
  float* Qs = smem;
  float* dOs = Qs + BT * pitch;
  float* Ks = dOs + BT * pitch;
  float* Vs = Ks + BT * pitch;
  float* Ss = Vs + BT * pitch;     // dS [BT, BT + 1]
  float* dQs = Ss + BT * (BT + 1);  // [BT, hd]
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int q0 = blockIdx.x * BT, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const typename S::Bits* base = qkv + qoff;

  load_tile<BT, S>(Qs, base, ld, q0, T, hd);
  load_tile<BT, S>(dOs, dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd, d, q0, T, hd);
  for (int i = threadIdx.x; i < BT * hd; i += kThreads) dQs[i] = 0.0f;
  float L[R], D[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int q = q0 + ty + 16 * i;
    L[i] = q < T ? lse[static_cast<long>(bh) * T + q] : 0.0f;
    D[i] = q < T ? dotp[static_cast<long>(bh) * T + q] : 0.0f;
  }

  for (int k0 = 0; k0 <= q0 && k0 < T; k0 += BT) {
    __syncthreads();
    load_tile<BT, S>(Ks, base + d, ld, k0, T, hd);
    load_tile<BT, S>(Vs, base + 2 * d, ld, k0, T, hd);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = ty + 16 * i, q = q0 + r;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int kr = tx + 16 * j, k = k0 + kr;
        float ds = 0.0f;
        if (k <= q && q < T) {
          const float p = math::exp_approx(scale * dot_rows(Qs + r * pitch, Ks + kr * pitch, hd) - L[i]);
          ds = S::load(S::store(p * (dot_rows(dOs + r * pitch, Vs + kr * pitch, hd) - D[i])));  // round(dS)
        }
        Ss[r * (BT + 1) + kr] = ds;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = ty + 16 * i;
      const float* ds = Ss + r * (BT + 1);
      for (int c = tx; c < hd; c += 16) {
        float acc = 0.0f;
#pragma unroll 8
        for (int j = 0; j < BT; ++j) acc = fmaf(ds[j], Ks[j * pitch + c], acc);
        dQs[r * hd + c] += scale * acc;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = ty + 16 * i, q = q0 + r;
    if (q >= T) continue;
    float* dQ = dqkv + qoff + static_cast<long>(q) * ld;
    for (int c = tx; c < hd; c += 16) dQ[c] = dQs[r * hd + c];
  }
}

// dV_k = sum_{q >= k} P_qk dO_q and dK_k = scale sum_{q >= k} dS_qk Q_q. grid (key tiles, B*H).
template <int BT, class S>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(const typename S::Bits* qkv, const float* lse, const typename S::Bits* dout,
                         const float* dotp, float* dqkv, int T, int d, int H, float scale) {
  constexpr int R = BT / 16;
  extern __shared__ float smem[];
  const int hd = d / H, pitch = hd + 1;
  float* Ks = smem;
  float* Vs = Ks + BT * pitch;
  float* Qs = Vs + BT * pitch;
  float* dOs = Qs + BT * pitch;
  float* Ps = dOs + BT * pitch;       // [BT keys, BT + 1]
  float* Ss = Ps + BT * (BT + 1);      // dS, same layout
  float* dKs = Ss + BT * (BT + 1);     // [BT, hd]
  float* dVs = dKs + BT * hd;          // [BT, hd]
  float* Ls = dVs + BT * hd;           // [BT] lse of the query tile
  float* Ds = Ls + BT;                 // [BT] D of the query tile
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int k0 = blockIdx.x * BT, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const typename S::Bits* base = qkv + qoff;
  const typename S::Bits* dObase = dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;

  load_tile<BT, S>(Ks, base + d, ld, k0, T, hd);
  load_tile<BT, S>(Vs, base + 2 * d, ld, k0, T, hd);
  for (int i = threadIdx.x; i < BT * hd; i += kThreads) dKs[i] = dVs[i] = 0.0f;

  for (int q0 = k0; q0 < T; q0 += BT) {  // query tiles from the diagonal on
    __syncthreads();
    load_tile<BT, S>(Qs, base, ld, q0, T, hd);
    load_tile<BT, S>(dOs, dObase, d, q0, T, hd);
    for (int i = threadIdx.x; i < BT; i += kThreads) {
      const bool in = q0 + i < T;
      Ls[i] = in ? lse[static_cast<long>(bh) * T + q0 + i] : 0.0f;
      Ds[i] = in ? dotp[static_cast<long>(bh) * T + q0 + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int kr = ty + 16 * i, k = k0 + kr;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int qr = tx + 16 * j, q = q0 + qr;
        float p = 0.0f, ds = 0.0f;
        if (k <= q && q < T) {
          p = math::exp_approx(scale * dot_rows(Qs + qr * pitch, Ks + kr * pitch, hd) - Ls[qr]);
          ds = S::load(S::store(p * (dot_rows(dOs + qr * pitch, Vs + kr * pitch, hd) - Ds[qr])));  // round(dS)
          p = S::load(S::store(p));                                                                  // round(P)
        }
        Ps[kr * (BT + 1) + qr] = p;
        Ss[kr * (BT + 1) + qr] = ds;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int kr = ty + 16 * i;
      const float* p = Ps + kr * (BT + 1);
      const float* ds = Ss + kr * (BT + 1);
      for (int c = tx; c < hd; c += 16) {
        float av = 0.0f, ak = 0.0f;
#pragma unroll 8
        for (int j = 0; j < BT; ++j) {
          av = fmaf(p[j], dOs[j * pitch + c], av);
          ak = fmaf(ds[j], Qs[j * pitch + c], ak);
        }
        dVs[kr * hd + c] += av;
        dKs[kr * hd + c] += scale * ak;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int kr = ty + 16 * i, k = k0 + kr;
    if (k >= T) continue;
    float* dK = dqkv + qoff + d + static_cast<long>(k) * ld;
    float* dV = dqkv + qoff + 2 * d + static_cast<long>(k) * ld;
    for (int c = tx; c < hd; c += 16) {
      dK[c] = dKs[kr * hd + c];
      dV[c] = dVs[kr * hd + c];
    }
  }
}

int max_shared_bytes() {
  int dev = 0, bytes = 0;
  STRATA_CHECK_CUDA(cudaGetDevice(&dev));
  STRATA_CHECK_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes;
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  STRATA_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int BT, class S>
void forward_with(const void* qkv, void* out, float* lse, int B, int T, int d, int H, cudaStream_t s) {
  const int hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const size_t bytes = forward_floats(BT, hd) * sizeof(float);
  allow_shared(attention_forward_kernel<BT, S>, bytes);
  const dim3 grid((T + BT - 1) / BT, static_cast<unsigned>(B * H));
  attention_forward_kernel<BT, S><<<grid, kThreads, bytes, s>>>(as<S>(qkv), as<S>(out), lse, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

template <int BT, class S>
void backward_with(const void* qkv, const float* lse, const void* dout, float* dqkv, const float* dotp, int B, int T,
                   int d, int H, cudaStream_t s) {
  const int hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const dim3 grid((T + BT - 1) / BT, static_cast<unsigned>(B * H));
  const size_t dq_bytes = dq_floats(BT, hd) * sizeof(float), dkv_bytes = dkv_floats(BT, hd) * sizeof(float);
  allow_shared(attention_dq_kernel<BT, S>, dq_bytes);
  allow_shared(attention_dkv_kernel<BT, S>, dkv_bytes);
  attention_dq_kernel<BT, S>
      <<<grid, kThreads, dq_bytes, s>>>(as<S>(qkv), lse, as<S>(dout), dotp, dqkv, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
  attention_dkv_kernel<BT, S>
      <<<grid, kThreads, dkv_bytes, s>>>(as<S>(qkv), lse, as<S>(dout), dotp, dqkv, T, d, H, scale);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

int tile_or_throw(int head_dim) {
  const int bt = attention_tile(head_dim);
  if (bt == 0)
    throw ConfigError("attention: head dimension " + std::to_string(head_dim) + " needs " +
                      std::to_string(most_floats(32, head_dim) * sizeof(float)) +
                      " bytes of shared memory per block, more than this GPU's " +
                      std::to_string(max_shared_bytes()) + "; use more heads");
  return bt;
}

}  // namespace

int attention_tile(int head_dim) {
  const size_t limit = static_cast<size_t>(max_shared_bytes());
  if (most_floats(64, head_dim) * sizeof(float) <= limit) return 64;
  if (most_floats(32, head_dim) * sizeof(float) <= limit) return 32;
  return 0;
}

void attention_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H, cudaStream_t s) {
  const int bt = tile_or_throw(d / H);
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    if (bt == 64)
      forward_with<64, S>(qkv, out, lse, B, T, d, H, s);
    else
      forward_with<32, S>(qkv, out, lse, B, T, d, H, s);
  });
}

void attention_backward(const void* qkv, const void* out, DType t, const float* lse, const void* dout, float* dqkv,
                        float* dotp, int B, int T, int d, int H, cudaStream_t s) {
  const long n = static_cast<long>(B) * H * T;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535);
  const int bt = tile_or_throw(d / H);
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    attention_dot_kernel<S><<<blocks, 256, 0, s>>>(as<S>(out), as<S>(dout), dotp, B, T, d, H);
    STRATA_CHECK_CUDA(cudaGetLastError());
    if (bt == 64)
      backward_with<64, S>(qkv, lse, dout, dqkv, dotp, B, T, d, H, s);
    else
      backward_with<32, S>(qkv, lse, dout, dqkv, dotp, B, T, d, H, s);
  });
}

}  // namespace strata::detail::cuda
