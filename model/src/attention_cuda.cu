// Causal multi-head attention on the cuda backend, three ways (kernels_cuda.hpp's
// AttentionKernels) of the same math, attention_cpu.cpp's: scores scaled by
// 1/sqrt(head_dim), probabilities by exp_approx, masked ones exactly 0; statistics (max,
// sum, log-sum-exp) fp32; dq, dk, dv written fp32. In 16 bits both round where
// docs/mixed-precision.md says: the normalised probabilities P before P V and P^T dO, dS
// before dS K and dS^T Q, the output once when stored.
//
// Gemm (the default). Per batch item and chunk of heads (heads lie hd columns apart in
// qkv, so one strided-batched cuBLAS call covers a chunk), the scaled scores
// S = scale Q K^T of every query against every key up to the chunk's last query land in
// fp32 scratch; a kernel (one warp per query row) takes each row's causal softmax, lse =
// max + log(sum), P = exp(S - max) / sum, exactly 0 past the query, into P; a second GEMM
// writes O = P V straight into out (cuBLAS rounds a 16-bit result once from its fp32
// sum; the model's handle disallows reduced-precision reductions). Backward recomputes S,
// forms dP = dO V^T, and a kernel makes P = exp(S - lse) and dS = P (dP - D); then
// dV = P^T dO, dQ = scale dS K and dK = scale dS^T Q go into dqkv. The masked upper
// triangle is computed and zeroed, not skipped: simple, and cheap on the tensor cores
// next to what it replaces. Why: the flash kernels below compute in fp32 on the CUDA cores,
// about 17 ms per layer and micro-batch (arithmetic from the step time) for a 1.1B GPT at
// head dimension 128 and 1024 tokens on an H200, which made its bf16 step 6.7x PyTorch's. In
// bf16 and fp16 the GEMMs are 16-bit operands with fp32 accumulation on the tensor
// cores; in fp32 they are fp32 GEMMs under the handle's math mode (the model's: no TF32),
// so fp32 results stay within fp32 rounding of the flash kernels' and the cpu model's.
// Scratch (attention_gemm_scratch_bytes): per unit of work, S and dP in fp32 and, in 16
// bits, P and dS in the storage type (GEMM operands); fp32 P and dS overwrite S and dP in
// place. A unit is as many heads as fit under the cap, or, where one head's [T, T] scores
// do not, a chunk of its query rows (backward then adds each chunk's dK, dV to the
// previous ones', the last rows first, since they see every key).
// Verified on an H200: test_gpt_cuda against the cpu model (head dimensions 24 to 144,
// T = 100, fp32/bf16/fp16, GPT-2 and Llama), memcheck and racecheck clean; the 1.1B bf16
// step with the GPU optimizer takes 0.422 s with these kernels and 1.392 s with flash
// (docs/training.md). The flash kernels have run on an H100 and an H200 as well.
//
// Flash (STRATA_ATTENTION=flash, kept to compare against and for shapes where scratch is
// unwelcome): FlashAttention-2's loop order, fp32 on the CUDA cores; q, k, v, the output
// and its gradient stored as the model's precision S and converted to fp32 as tiles are
// staged (storage_cuda.cuh): one block of 256 threads per (query or key tile,
// batch x head). A block stages its tile of q (or k, v) and each visiting tile of k, v
// (or q, dout) in shared memory, coalesced; the [BT, BT] tile of scores lives in
// registers and shared memory, never the [T, T] matrix. Forward keeps an online softmax
// and the log-sum-exp; backward recomputes the probabilities from it: one kernel
// accumulates dq per query tile, one dk and dv per key tile, so no atomics and no races.
//
// Thread (ty, tx) = (tid / 16, tid % 16) owns tile rows ty + 16 i and columns tx + 16 j;
// a row's 16 owners are lanes of one warp, so row max and sum are warp shuffles. BT is 64,
// or 32 where a 64-row tile's shared memory exceeds the GPU's per-block limit (large head
// dimensions); attention_tile() says which, or that none fits. The online-softmax
// correction is expf. P normalised needs the row's log-sum-exp before any P V term, so
// the 16-bit forward takes two passes over the key tiles (the first only for max and
// sum); fp32 keeps the one-pass online softmax, bit for bit the kernel that ran on the
// H100.
//
// Mma (STRATA_ATTENTION=mma; attention_mma_cuda.cu, strata/model/attention_mma_kernels.hpp):
// FlashAttention-2 on mma.sync, every product of each tile (Q K^T and P V; in backward
// Q K^T, dO V^T, dS K, P^T dO and dS^T Q) on the tensor cores with 16-bit operands and
// fp32 accumulators, the scores of a tile in registers: no [T, T] scratch. bf16 and fp16
// only, head dimensions multiples of 16 up to 128. Checked on the CPU by an emulation of
// its thread blocks; this version NOT yet run on a GPU: the default stays gemm until
// scripts/gpu-check.sh attn has checked it against the cpu model and timed it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention_mma_cuda.hpp"
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

// ---- The Gemm path ----

constexpr int kRowsPerBlock = kThreads / 32;  // softmax kernels: one warp per score row

using GemmPlan = AttentionGemmPlan;  // strata/model/attention_plan.hpp

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Score rows of a unit: row r is query q0 + r % nq of the unit's head r / nq, against
// keys 0 .. nk-1 (nk = q0 + nq), ld elements apart. s [rows, ld] fp32 scaled scores in;
// p [rows, ld] out, of type S: the normalised probabilities exp(s - max) / sum over keys
// up to the query, 0 past it (p may be s itself when S is fp32: each lane reads an
// element before it writes it). lse of the unit's head j at lse[j * T + q].
template <class S>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_kernel(const float* s, typename S::Bits* p, float* lse, int rows, int nq, int q0, int nk, long ld,
                        int T) {
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int q = q0 + r % nq;
  const float* srow = s + r * ld;
  typename S::Bits* prow = p + r * ld;
  float mx = -INFINITY;
  for (int j = lane; j <= q; j += 32) mx = fmaxf(mx, srow[j]);
  mx = warp_max(mx);  // finite: key 0 is visible to every query
  float sum = 0.0f;
  for (int j = lane; j <= q; j += 32) sum += math::exp_approx(srow[j] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int j = lane; j < nk; j += 32) prow[j] = S::store(j <= q ? math::exp_approx(srow[j] - mx) * inv : 0.0f);
  if (lane == 0) lse[static_cast<long>(r / nq) * T + q] = mx + logf(sum);
}

// Backward over the same rows: from the scaled scores s and dp = dO V^T (fp32), P =
// exp(s - lse) and dS = P (dp - D), both 0 past the query, stored as type S (rounded in
// 16 bits) into p and ds, which may be s and dp themselves when S is fp32. lse and D
// (dotp) of the unit's head j at [j * T + q].
template <class S>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_rows_kernel(const float* s, const float* dp, typename S::Bits* p, typename S::Bits* ds,
                                 const float* lse, const float* dotp, int rows, int nq, int q0, int nk, long ld,
                                 int T) {
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int q = q0 + r % nq;
  const long stat = static_cast<long>(r / nq) * T + q;
  const float L = lse[stat], D = dotp[stat];
  const long off = r * ld;
  for (int j = lane; j < nk; j += 32) {
    float pj = 0.0f, dsj = 0.0f;
    if (j <= q) {
      pj = math::exp_approx(s[off + j] - L);
      dsj = pj * (dp[off + j] - D);
    }
    p[off + j] = S::store(pj);
    ds[off + j] = S::store(dsj);
  }
}

// Element i of an array of type t.
const void* elem(const void* p, DType t, long i) { return static_cast<const char*>(p) + i * dtype_size(t); }
void* elem(void* p, DType t, long i) { return static_cast<char*>(p) + i * dtype_size(t); }

// Row-major C[M,N] = alpha op(A) op(B) + beta C for `batch` products whose operands lie
// sa, sb, sc elements apart, through column-major cuBLAS as gpt_cuda.cpp's gemm: the
// same product transposed, C^T = op(B)^T op(A)^T. A and B of type ab, C of type ct, fp32
// accumulation (CUBLAS_COMPUTE_32F: tensor cores over 16-bit operands; fp32 operands
// under the handle's math mode). beta 0 does not read C.
void gemm_rows(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const void* A, long lda, long sa,
               const void* B, long ldb, long sb, DType ab, float beta, void* C, DType ct, long ldc, long sc,
               int batch) {
  STRATA_CHECK_CUBLAS(cublasGemmStridedBatchedEx(
      h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, cuda_type(ab),
      static_cast<int>(ldb), sb, A, cuda_type(ab), static_cast<int>(lda), sa, &beta, C, cuda_type(ct),
      static_cast<int>(ldc), sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The plan for this call's T and H in the caller's scratch; checks the path's contract.
GemmPlan checked_plan(const AttentionPath& path, int T, int H, DType t, cudaStream_t s) {
  STRATA_CHECK(path.blas != nullptr && path.scratch != nullptr, "the Gemm attention path needs a handle and scratch");
  cudaStream_t hs = nullptr;
  STRATA_CHECK_CUBLAS(cublasGetStream(path.blas, &hs));
  STRATA_CHECK(hs == s, "the Gemm attention path's cuBLAS handle is not on the launch stream");
  const GemmPlan p = attention_gemm_plan(T, H, t, path.scratch_bytes);
  STRATA_CHECK(p.bytes() <= path.scratch_bytes,
               "attention scratch of " + std::to_string(path.scratch_bytes) + " bytes holds no row of " +
                   std::to_string(T) + " scores");
  return p;
}

unsigned row_blocks(long rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

template <class S>
void forward_gemm(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                  const AttentionPath& path, cudaStream_t s) {
  const int hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const GemmPlan p = checked_plan(path, T, H, t, s);
  const long ld3 = 3L * d;
  float* scores = static_cast<float*>(path.scratch);
  // P: over the scores in fp32; in 16 bits past the fp32 S and dP buffers (backward's layout).
  void* probs = t == DType::F32 ? path.scratch : static_cast<void*>(scores + 2 * p.block);
  for (int b = 0; b < B; ++b) {
    const void* base = elem(qkv, t, static_cast<long>(b) * T * ld3);
    for (int h0 = 0; h0 < H; h0 += p.heads) {
      const int nb = std::min(p.heads, H - h0);
      const void* K = elem(base, t, d + static_cast<long>(h0) * hd);
      const void* V = elem(base, t, 2L * d + static_cast<long>(h0) * hd);
      for (int q0 = 0; q0 < T; q0 += p.rows) {
        const int nq = std::min(p.rows, T - q0), nk = q0 + nq;
        const long sblk = nq * p.ld;  // elements between the heads' score blocks
        const void* Q = elem(base, t, q0 * ld3 + static_cast<long>(h0) * hd);
        gemm_rows(path.blas, false, true, nq, nk, hd, scale, Q, ld3, hd, K, ld3, hd, t, 0.0f, scores, DType::F32,
                  p.ld, sblk, nb);
        const long rows = static_cast<long>(nb) * nq;
        softmax_rows_kernel<S><<<row_blocks(rows), kThreads, 0, s>>>(
            scores, as<S>(probs), lse + (static_cast<long>(b) * H + h0) * T, static_cast<int>(rows), nq, q0, nk, p.ld,
            T);
        STRATA_CHECK_CUDA(cudaGetLastError());
        void* O = elem(out, t, (static_cast<long>(b) * T + q0) * d + static_cast<long>(h0) * hd);
        gemm_rows(path.blas, false, false, nq, hd, nk, 1.0f, probs, p.ld, sblk, V, ld3, hd, t, 0.0f, O, t, d, hd, nb);
      }
    }
  }
}

// dotp already holds D = rowsum(dO * O).
template <class S>
void backward_gemm(const void* qkv, DType t, const float* lse, const void* dout, float* dqkv, const float* dotp,
                   int B, int T, int d, int H, const AttentionPath& path, cudaStream_t s) {
  const int hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const GemmPlan p = checked_plan(path, T, H, t, s);
  const long ld3 = 3L * d;
  float* scores = static_cast<float*>(path.scratch);
  float* dscores = scores + p.block;  // dP
  const bool f32 = t == DType::F32;
  void* probs = f32 ? static_cast<void*>(scores) : static_cast<void*>(scores + 2 * p.block);
  void* dprobs = f32 ? static_cast<void*>(dscores) : elem(probs, t, p.block);  // dS
  for (int b = 0; b < B; ++b) {
    const void* base = elem(qkv, t, static_cast<long>(b) * T * ld3);
    for (int h0 = 0; h0 < H; h0 += p.heads) {
      const int nb = std::min(p.heads, H - h0);
      const long col = static_cast<long>(h0) * hd;
      const void* K = elem(base, t, d + col);
      const void* V = elem(base, t, 2L * d + col);
      float* dQ = dqkv + static_cast<long>(b) * T * ld3 + col;
      float* dK = dQ + d;
      float* dV = dQ + 2 * d;
      // Query chunks from the last: it sees every key, so its dK and dV (beta 0) write all
      // T rows, and the earlier chunks add to the rows they see.
      for (int q1 = T; q1 > 0; q1 -= p.rows) {
        const int q0 = std::max(0, q1 - p.rows), nq = q1 - q0, nk = q1;
        const float beta = q1 == T ? 0.0f : 1.0f;
        const long sblk = nq * p.ld;
        const void* Q = elem(base, t, q0 * ld3 + col);
        const void* dO = elem(dout, t, (static_cast<long>(b) * T + q0) * d + col);
        gemm_rows(path.blas, false, true, nq, nk, hd, scale, Q, ld3, hd, K, ld3, hd, t, 0.0f, scores, DType::F32,
                  p.ld, sblk, nb);
        gemm_rows(path.blas, false, true, nq, nk, hd, 1.0f, dO, d, hd, V, ld3, hd, t, 0.0f, dscores, DType::F32, p.ld,
                  sblk, nb);
        const long rows = static_cast<long>(nb) * nq;
        const long stat = (static_cast<long>(b) * H + h0) * T;
        softmax_backward_rows_kernel<S><<<row_blocks(rows), kThreads, 0, s>>>(
            scores, dscores, as<S>(probs), as<S>(dprobs), lse + stat, dotp + stat, static_cast<int>(rows), nq, q0, nk,
            p.ld, T);
        STRATA_CHECK_CUDA(cudaGetLastError());
        // dV = P^T dO ; dQ = scale dS K ; dK = scale dS^T Q (fp32 results)
        gemm_rows(path.blas, true, false, nk, hd, nq, 1.0f, probs, p.ld, sblk, dO, d, hd, t, beta, dV, DType::F32,
                  ld3, hd, nb);
        gemm_rows(path.blas, false, false, nq, hd, nk, scale, dprobs, p.ld, sblk, K, ld3, hd, t, 0.0f,
                  dQ + q0 * ld3, DType::F32, ld3, hd, nb);
        gemm_rows(path.blas, true, false, nk, hd, nq, scale, dprobs, p.ld, sblk, Q, ld3, hd, t, beta, dK, DType::F32,
                  ld3, hd, nb);
      }
    }
  }
}

}  // namespace

int max_shared_bytes() {
  int dev = 0, bytes = 0;
  STRATA_CHECK_CUDA(cudaGetDevice(&dev));
  STRATA_CHECK_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes;
}

int attention_tile(int head_dim) {
  const size_t limit = static_cast<size_t>(max_shared_bytes());
  if (most_floats(64, head_dim) * sizeof(float) <= limit) return 64;
  if (most_floats(32, head_dim) * sizeof(float) <= limit) return 32;
  return 0;
}

AttentionKernels attention_kernels_from_env() {
  const char* v = std::getenv("STRATA_ATTENTION");
  if (v == nullptr || *v == '\0' || std::string(v) == "gemm") return AttentionKernels::Gemm;
  if (std::string(v) == "flash") return AttentionKernels::Flash;
  if (std::string(v) == "mma") return AttentionKernels::Mma;
  throw ConfigError(std::string("STRATA_ATTENTION=") + v +
                    ": the cuda attention kernels are \"gemm\" (cuBLAS, the default), \"flash\" or \"mma\"");
}

void attention_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                       const AttentionPath& path, cudaStream_t s) {
  if (path.kernels == AttentionKernels::Mma) {
    attention_mma_forward(qkv, out, t, lse, B, T, d, H, s);
    return;
  }
  const int bt = path.kernels == AttentionKernels::Flash ? tile_or_throw(d / H) : 0;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    if (path.kernels == AttentionKernels::Gemm)
      forward_gemm<S>(qkv, out, t, lse, B, T, d, H, path, s);
    else if (bt == 64)
      forward_with<64, S>(qkv, out, lse, B, T, d, H, s);
    else
      forward_with<32, S>(qkv, out, lse, B, T, d, H, s);
  });
}

void attention_backward(const void* qkv, const void* out, DType t, const float* lse, const void* dout, float* dqkv,
                        float* dotp, int B, int T, int d, int H, const AttentionPath& path, cudaStream_t s) {
  const long n = static_cast<long>(B) * H * T;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 65535 ? n / 256 + 1 : 65535);
  const int bt = path.kernels == AttentionKernels::Flash ? tile_or_throw(d / H) : 0;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    attention_dot_kernel<S><<<blocks, 256, 0, s>>>(as<S>(out), as<S>(dout), dotp, B, T, d, H);
    STRATA_CHECK_CUDA(cudaGetLastError());
    if (path.kernels == AttentionKernels::Gemm)
      backward_gemm<S>(qkv, t, lse, dout, dqkv, dotp, B, T, d, H, path, s);
    else if (path.kernels == AttentionKernels::Mma)
      attention_mma_backward(qkv, t, lse, dout, dqkv, dotp, B, T, d, H, s);
    else if (bt == 64)
      backward_with<64, S>(qkv, lse, dout, dqkv, dotp, B, T, d, H, s);
    else
      backward_with<32, S>(qkv, lse, dout, dqkv, dotp, B, T, d, H, s);
  });
}

}  // namespace strata::detail::cuda
