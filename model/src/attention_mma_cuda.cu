// The tensor-core causal attention (AttentionKernels::Mma, STRATA_ATTENTION=mma): the
// flash kernels' algorithm and rounding in 16 bits (attention_cuda.cu), with both products
// of every tile on the tensor cores through WMMA (nvcuda::wmma, 16x16x16, bf16 or fp16
// operands, fp32 accumulators), and never the [T, T] scores. Compiled here, NOT yet run
// on a GPU (scripts/gpu-check.sh attn runs its tests, the sanitizers and the 1.1B step).
//
// The math is the flash kernels' 16-bit path, term for term: s = scale (q . k) with fp32
// accumulation; masked probabilities (k > q) exactly 0; statistics fp32 and exp_approx as
// there. Forward takes two passes over the key tiles up to the diagonal: the first for
// each row's max and sum (the online rescale by expf, lse = max + log(sum)), the second
// for P = round(exp_approx(s - lse)) and O = P V in fp32, O rounded once when stored and
// lse written fp32. Backward (D = rowsum(dO * O) already in dotp, attention_dot_kernel):
// P = exp_approx(s - lse) in fp32, dP = dO V^T, dS = round(P (dP - D)); the dq kernel
// (one block per query tile) makes dQ = scale dS K, the dkv kernel (one block per key
// tile) dV = round(P)^T dO and dK = scale dS^T Q; all three fp32 into dqkv, each element
// written by one block, so no atomics. The products sum in fp32 in another order than
// the flash kernels' fmaf loops (and dQ, dK are scaled once at the end, not per tile), so
// results differ from theirs by fp32 rounding alone; the 16-bit operands are the values
// the flash kernels convert to fp32, exactly.
//
// Tiles (strata/model/attention_mma_plan.hpp lays out the shared memory and picks the
// tile): BT = 64 query and key rows (32 where a 64-row tile does not fit the GPU's
// shared memory), BT / 16 warps, each warp owning 16 rows of its block's tile (query rows
// in forward and dq, key rows in dkv). Per visited tile a warp computes its [16, BT] strip
// of scores (and dP) with WMMA into fp32 shared memory, takes the row-wise softmax or dS
// there with two lanes per row, writes the 16-bit P (dS) strip for the second product,
// and accumulates that product into WMMA accumulator fragments it holds for the whole
// loop: O or dQ ([16, hd], hd / 16 fragments), or dK and dV. Only the K, V (or Q, dO)
// tiles are shared by the warps, so a __syncthreads brackets each tile's copy and the
// rest needs only __syncwarp. Key tiles above the diagonal are skipped (dkv: query tiles
// before the key tile), and only the diagonal tile and one cut by T are masked element
// by element (attention_mma_visit). Why WMMA and not the gemm path: the [T, T] scores of
// the gemm path make three extra passes over memory per product and scratch of up to
// 256 MiB; here a tile's scores stay in shared memory. Blocks start in grid order, so the
// forward and dq kernels take query tiles from the last (which visit the most key tiles)
// and the dkv kernel key tiles from the first (the most query tiles): the long blocks
// start first and the short ones fill the tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "attention_mma_cuda.hpp"
#include "kernels_cuda.hpp"
#include "storage_cuda.cuh"

#include "strata/core/math/gpt.hpp"
#include "strata/model/attention_mma_plan.hpp"

// bf16 WMMA needs sm_80: a build for older GPUs compiles the kernels to a trap, and the
// launchers refuse such a GPU before launching (attention_mma_gpu_refusal).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define STRATA_MMA_ARCH 1
#else
#define STRATA_MMA_ARCH 0
#endif

namespace strata::detail::cuda {

namespace {

namespace wmma = nvcuda::wmma;

#if STRATA_MMA_ARCH

template <class S>
struct Operand;  // WMMA's type for the 16-bit storage S (the same bits)
template <>
struct Operand<Bf16S> {
  using T = __nv_bfloat16;
};
template <>
struct Operand<Fp16S> {
  using T = __half;
};

template <class S>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, typename Operand<S>::T, wmma::row_major>;
template <class S>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, typename Operand<S>::T, wmma::row_major>;
template <class S>  // B = M^T for a row-major M: element (k, n) at M[n * ldm + k]
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, typename Operand<S>::T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <class S>
__device__ const typename Operand<S>::T* operand(const uint16_t* p) {
  return reinterpret_cast<const typename Operand<S>::T*>(p);
}

// Rows t0 .. t0+BT-1 of a head's [T, ld]-strided slice (hd 16-bit values each, 16-byte
// aligned: hd and ld are multiples of 16, the base checked by the launcher) into a
// [BT, pitch] tile, 16 bytes a thread, consecutive threads along a row; zeros past T.
template <int BT>
__device__ void copy_tile(uint16_t* tile, int pitch, const uint16_t* src, long ld, int t0, int T, int hd) {
  const int chunks = hd / 8;
  for (int i = threadIdx.x; i < BT * chunks; i += 2 * BT) {
    const int r = i / chunks, c = (i - r * chunks) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t0 + r < T) v = *reinterpret_cast<const uint4*>(src + static_cast<long>(t0 + r) * ld + c);
    *reinterpret_cast<uint4*>(tile + r * pitch + c) = v;
  }
}

// acc = A B^T for the warp: A its [16, hd] strip, B a whole [BT, hd] tile, both 16-bit
// row-major `pitch` apart: its 16 rows' scores (dot products) against the tile's BT rows.
template <int BT, class S>
__device__ void strip_by_tile_t(FragC (&acc)[BT / 16], const uint16_t* a, const uint16_t* b, int pitch, int hd) {
#pragma unroll
  for (int j = 0; j < BT / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
  for (int kk = 0; kk < hd; kk += 16) {
    FragA<S> fa;
    wmma::load_matrix_sync(fa, operand<S>(a + kk), pitch);
#pragma unroll
    for (int j = 0; j < BT / 16; ++j) {
      FragBt<S> fb;
      wmma::load_matrix_sync(fb, operand<S>(b + 16 * j * pitch + kk), pitch);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
}

// The warp's [16, BT] fp32 strip `s` (pitch floats a row) from the fragments.
template <int BT>
__device__ void store_strip(float* s, int pitch, const FragC (&acc)[BT / 16]) {
#pragma unroll
  for (int j = 0; j < BT / 16; ++j) wmma::store_matrix_sync(s + 16 * j, acc[j], pitch, wmma::mem_row_major);
}

// acc[f] += A M[:, 16 f .. 16 f + 15] for the fragments f < hd / 16 (of NF): A the warp's
// [16, BT] 16-bit strip (pa apart), M a [BT, hd] 16-bit tile (pm apart): P V, dS K,
// P^T dO, dS^T Q.
template <int BT, int NF, class S>
__device__ void strip_by_tile(FragC (&acc)[NF], const uint16_t* a, int pa, const uint16_t* m, int pm, int hd) {
#pragma unroll
  for (int kk = 0; kk < BT; kk += 16) {
    FragA<S> fa;
    wmma::load_matrix_sync(fa, operand<S>(a + kk), pa);
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      if (16 * f < hd) {  // the same for the whole warp
        FragB<S> fb;
        wmma::load_matrix_sync(fb, operand<S>(m + kk * pm + 16 * f), pm);
        wmma::mma_sync(acc[f], fa, fb, acc[f]);
      }
    }
  }
}

// The warp's [16, hd] result in acc, times `scale`, through its fp32 strip `stage`
// ([16, pitch >= BT]) BT / 16 fragments at a time; put(r, c, value) for each of its
// elements, r < 16 the warp's row, a row's columns on consecutive lanes.
template <int BT, int NF, class F>
__device__ void drain(FragC (&acc)[NF], float scale, float* stage, int pitch, int hd, F&& put) {
  constexpr int kPer = BT / 16;
  static_assert(NF % kPer == 0, "a staging round holds BT / 16 fragments");
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int f0 = 0; f0 < NF; f0 += kPer) {
    if (16 * f0 >= hd) break;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (16 * (f0 + j) < hd) {
#pragma unroll
        for (int e = 0; e < acc[f0 + j].num_elements; ++e) acc[f0 + j].x[e] *= scale;
        wmma::store_matrix_sync(stage + 16 * j, acc[f0 + j], pitch, wmma::mem_row_major);
      }
    }
    __syncwarp();
    const int cols = hd - 16 * f0 < 16 * kPer ? hd - 16 * f0 : 16 * kPer;
    for (int i = lane; i < 16 * cols; i += 32) {
      const int r = i / cols, c = i - r * cols;
      put(r, 16 * f0 + c, stage[r * pitch + c]);
    }
    __syncwarp();  // read before the next round overwrites
  }
}

// The elements of the warp's [16, BT] strip a lane takes in the element-wise steps: row
// lane / 2, the columns of one parity, col(j) for j < BT / 2. Rows r and r + 8 start the
// same bank with a pitch of BT + 4 floats (4 r mod 32), so the second half visits its
// columns rotated by one pair: the 32 lanes then read 32 different banks.
template <int BT>
struct LaneCols {
  int row, half, rot;
  __device__ explicit LaneCols(int lane) : row(lane / 2), half(lane % 2), rot(lane / 16) {}
  __device__ int col(int j) const { return half + 2 * ((j + rot) % (BT / 2)); }
};

__device__ uint16_t* buf16(unsigned char* smem, uint32_t off) { return reinterpret_cast<uint16_t*>(smem + off); }
__device__ float* buf32(unsigned char* smem, uint32_t off) { return reinterpret_cast<float*>(smem + off); }

#endif  // STRATA_MMA_ARCH

// grid (query tiles, B*H), 2 BT threads. out [B*T, d], lse [B*H, T].
template <int BT, int NF, class S>
__global__ void __launch_bounds__(2 * BT)
    attention_mma_forward_kernel(const uint16_t* qkv, uint16_t* out, float* lse, int T, int d, int H, float scale,
                                 AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  const int hd = d / H, ph = lay.pitch16, ps = lay.pitch_scores, pp = lay.pitch_probs;
  uint16_t* Qs = buf16(smem, lay.q);
  uint16_t* Ks = buf16(smem, lay.k);
  uint16_t* Vs = buf16(smem, lay.v);
  const int warp = threadIdx.x / 32;
  const LaneCols<BT> me(threadIdx.x % 32);
  float* Sw = buf32(smem, lay.scores) + 16 * warp * ps;     // the warp's [16, BT] scores
  uint16_t* Pw = buf16(smem, lay.probs) + 16 * warp * pp;  // and P
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x), q0 = qt * BT;  // the longest rows first (see the top)
  const int q = q0 + 16 * warp + me.row;  // the lane's query
  const long ld = 3L * d;
  const uint16_t* base = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const uint16_t* Qw = Qs + 16 * warp * ph;
  copy_tile<BT>(Qs, ph, base, ld, q0, T, hd);
  FragC acc[BT / 16];

  // First pass: the row's max m and sum l over the keys up to it, rescaled online.
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous tile's Ks read (and Qs copied)
    copy_tile<BT>(Ks, ph, base + d, ld, kt * BT, T, hd);
    __syncthreads();
    strip_by_tile_t<BT, S>(acc, Qw, Ks, ph, hd);
    store_strip<BT>(Sw, ps, acc);
    __syncwarp();
    const bool whole = attention_mma_visit(qt, kt, BT, T) == MmaTileVisit::Whole;
    float s[BT / 2], mx = m;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = me.col(j);
      s[j] = whole || kt * BT + c <= q ? scale * Sw[me.row * ps + c] : -INFINITY;
      mx = fmaxf(mx, s[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // finite: key 0 is visible to every row
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) sum += s[j] == -INFINITY ? 0.0f : math::exp_approx(s[j] - mx);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * expf(m - mx) + sum;  // 0 * 0 on the first tile
    m = mx;
  }
  const float row_lse = m + logf(l);

  // Second pass: P = round(exp(s - lse)), normalised, and O += P V.
  FragC o[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f) wmma::fill_fragment(o[f], 0.0f);
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous tile's Ks, Vs read
    copy_tile<BT>(Ks, ph, base + d, ld, kt * BT, T, hd);
    copy_tile<BT>(Vs, ph, base + 2 * d, ld, kt * BT, T, hd);
    __syncthreads();
    strip_by_tile_t<BT, S>(acc, Qw, Ks, ph, hd);
    store_strip<BT>(Sw, ps, acc);
    __syncwarp();
    const bool whole = attention_mma_visit(qt, kt, BT, T) == MmaTileVisit::Whole;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = me.col(j);
      const float p = whole || kt * BT + c <= q ? math::exp_approx(scale * Sw[me.row * ps + c] - row_lse) : 0.0f;
      Pw[me.row * pp + c] = S::store(p);
    }
    __syncwarp();
    strip_by_tile<BT, NF, S>(o, Pw, pp, Vs, ph, hd);
  }
  typename S::Bits* O = out + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
  drain<BT, NF>(o, 1.0f, Sw, ps, hd, [&](int r, int c, float v) {
    const int qr = q0 + 16 * warp + r;
    if (qr < T) O[static_cast<long>(qr) * d + c] = S::store(v);
  });
  if (me.half == 0 && q < T) lse[static_cast<long>(bh) * T + q] = row_lse;
#else
  __trap();
#endif
}

// dQ_q = scale sum_{k <= q} dS_qk K_k, dS_qk = round(P_qk (dO_q . V_k - D_q)). grid (query
// tiles, B*H), 2 BT threads.
template <int BT, int NF, class S>
__global__ void __launch_bounds__(2 * BT)
    attention_mma_dq_kernel(const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                            float* dqkv, int T, int d, int H, float scale, AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  const int hd = d / H, ph = lay.pitch16, ps = lay.pitch_scores, pp = lay.pitch_probs;
  uint16_t* Qs = buf16(smem, lay.q);
  uint16_t* dOs = buf16(smem, lay.dout);
  uint16_t* Ks = buf16(smem, lay.k);
  uint16_t* Vs = buf16(smem, lay.v);
  const int warp = threadIdx.x / 32;
  const LaneCols<BT> me(threadIdx.x % 32);
  float* Sw = buf32(smem, lay.scores) + 16 * warp * ps;     // S
  float* dPw = buf32(smem, lay.dscores) + 16 * warp * ps;   // dP
  uint16_t* dSw = buf16(smem, lay.dprobs) + 16 * warp * pp;  // round(dS)
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x), q0 = qt * BT;  // the longest rows first (see the top)
  const int q = q0 + 16 * warp + me.row;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const uint16_t* base = qkv + qoff;
  copy_tile<BT>(Qs, ph, base, ld, q0, T, hd);
  copy_tile<BT>(dOs, ph, dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd, d, q0, T, hd);
  const float L = q < T ? lse[static_cast<long>(bh) * T + q] : 0.0f;
  const float D = q < T ? dotp[static_cast<long>(bh) * T + q] : 0.0f;
  const uint16_t* Qw = Qs + 16 * warp * ph;
  const uint16_t* dOw = dOs + 16 * warp * ph;
  FragC acc[BT / 16];
  FragC dq[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f) wmma::fill_fragment(dq[f], 0.0f);

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous tile's Ks, Vs read (and Qs, dOs copied)
    copy_tile<BT>(Ks, ph, base + d, ld, kt * BT, T, hd);
    copy_tile<BT>(Vs, ph, base + 2 * d, ld, kt * BT, T, hd);
    __syncthreads();
    strip_by_tile_t<BT, S>(acc, Qw, Ks, ph, hd);
    store_strip<BT>(Sw, ps, acc);
    strip_by_tile_t<BT, S>(acc, dOw, Vs, ph, hd);
    store_strip<BT>(dPw, ps, acc);
    __syncwarp();
    const bool whole = attention_mma_visit(qt, kt, BT, T) == MmaTileVisit::Whole;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = me.col(j), e = me.row * ps + c;
      float ds = 0.0f;
      if (whole || (kt * BT + c <= q && q < T)) ds = math::exp_approx(scale * Sw[e] - L) * (dPw[e] - D);
      dSw[me.row * pp + c] = S::store(ds);
    }
    __syncwarp();
    strip_by_tile<BT, NF, S>(dq, dSw, pp, Ks, ph, hd);
  }
  float* dQ = dqkv + qoff;
  drain<BT, NF>(dq, scale, Sw, ps, hd, [&](int r, int c, float v) {
    const int qr = q0 + 16 * warp + r;
    if (qr < T) dQ[static_cast<long>(qr) * ld + c] = v;
  });
#else
  __trap();
#endif
}

// dV_k = sum_{q >= k} round(P_qk) dO_q and dK_k = scale sum_{q >= k} dS_qk Q_q, with the
// scores transposed (rows are keys): S^T = K Q^T, dP^T = V dO^T. grid (key tiles, B*H),
// 2 BT threads.
template <int BT, int NF, class S>
__global__ void __launch_bounds__(2 * BT)
    attention_mma_dkv_kernel(const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                             float* dqkv, int T, int d, int H, float scale, AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  const int hd = d / H, ph = lay.pitch16, ps = lay.pitch_scores, pp = lay.pitch_probs;
  uint16_t* Ks = buf16(smem, lay.k);
  uint16_t* Vs = buf16(smem, lay.v);
  uint16_t* Qs = buf16(smem, lay.q);
  uint16_t* dOs = buf16(smem, lay.dout);
  float* Ls = buf32(smem, lay.stats);  // [BT] lse of the query tile
  float* Ds = Ls + BT;                 // [BT] D of the query tile
  const int warp = threadIdx.x / 32;
  const LaneCols<BT> me(threadIdx.x % 32);
  float* Sw = buf32(smem, lay.scores) + 16 * warp * ps;      // S^T: the warp's keys x the tile's queries
  float* dPw = buf32(smem, lay.dscores) + 16 * warp * ps;    // dP^T
  uint16_t* Pw = buf16(smem, lay.probs) + 16 * warp * pp;    // round(P)^T
  uint16_t* dSw = buf16(smem, lay.dprobs) + 16 * warp * pp;  // round(dS)^T
  const int bh = blockIdx.y, b = bh / H, h = bh % H, kt = blockIdx.x, k0 = kt * BT;
  const int k = k0 + 16 * warp + me.row;  // the lane's key
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const uint16_t* base = qkv + qoff;
  const uint16_t* dObase = dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
  copy_tile<BT>(Ks, ph, base + d, ld, k0, T, hd);
  copy_tile<BT>(Vs, ph, base + 2 * d, ld, k0, T, hd);
  const uint16_t* Kw = Ks + 16 * warp * ph;
  const uint16_t* Vw = Vs + 16 * warp * ph;
  FragC acc[BT / 16];
  FragC dk[NF], dv[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f) wmma::fill_fragment(dk[f], 0.0f), wmma::fill_fragment(dv[f], 0.0f);

  const int tiles = (T + BT - 1) / BT;
  for (int qt = kt; qt < tiles; ++qt) {  // query tiles from the diagonal on
    const int q0 = qt * BT;
    __syncthreads();  // the previous tile's Qs, dOs, Ls, Ds read (and Ks, Vs copied)
    copy_tile<BT>(Qs, ph, base, ld, q0, T, hd);
    copy_tile<BT>(dOs, ph, dObase, d, q0, T, hd);
    for (int i = threadIdx.x; i < BT; i += 2 * BT) {
      const bool in = q0 + i < T;
      Ls[i] = in ? lse[static_cast<long>(bh) * T + q0 + i] : 0.0f;
      Ds[i] = in ? dotp[static_cast<long>(bh) * T + q0 + i] : 0.0f;
    }
    __syncthreads();
    strip_by_tile_t<BT, S>(acc, Kw, Qs, ph, hd);
    store_strip<BT>(Sw, ps, acc);
    strip_by_tile_t<BT, S>(acc, Vw, dOs, ph, hd);
    store_strip<BT>(dPw, ps, acc);
    __syncwarp();
    const bool whole = attention_mma_visit(qt, kt, BT, T) == MmaTileVisit::Whole;
#pragma unroll
    for (int j = 0; j < BT / 2; ++j) {
      const int c = me.col(j), e = me.row * ps + c, qq = q0 + c;  // column c: query qq
      float p = 0.0f, ds = 0.0f;
      if (whole || (k <= qq && qq < T)) {
        p = math::exp_approx(scale * Sw[e] - Ls[c]);
        ds = p * (dPw[e] - Ds[c]);
      }
      Pw[me.row * pp + c] = S::store(p);
      dSw[me.row * pp + c] = S::store(ds);
    }
    __syncwarp();
    strip_by_tile<BT, NF, S>(dv, Pw, pp, dOs, ph, hd);
    strip_by_tile<BT, NF, S>(dk, dSw, pp, Qs, ph, hd);
  }
  float* dK = dqkv + qoff + d;
  float* dV = dqkv + qoff + 2 * d;
  const auto put = [&](float* dst) {
    return [=](int r, int c, float v) {
      const int kr = k0 + 16 * warp + r;
      if (kr < T) dst[static_cast<long>(kr) * ld + c] = v;
    };
  };
  drain<BT, NF>(dk, scale, Sw, ps, hd, put(dK));
  drain<BT, NF>(dv, 1.0f, Sw, ps, hd, put(dV));
#else
  __trap();
#endif
}

// The kernels' compile-time shape: tile rows BT and accumulator fragments NF (hd <= 16 NF).
template <int BT_, int NF_, class S_>
struct Shape {
  static constexpr int BT = BT_, NF = NF_;
  using S = S_;
};

// Calls f(Shape<...>{}) for type t (BF16 or F16), tile bt (64 or 32) and head dimension hd.
template <class F>
void with_shape(DType t, int bt, int hd, F&& f) {
  const auto by_tile = [&](auto tag) {
    using S = decltype(tag);
    if (bt == 64) {
      if (hd <= 64) f(Shape<64, 4, S>{});
      else f(Shape<64, 8, S>{});
    } else {
      if (hd <= 64) f(Shape<32, 4, S>{});
      else f(Shape<32, 8, S>{});
    }
  };
  if (t == DType::BF16) by_tile(Bf16S{});
  else by_tile(Fp16S{});
}

int compute_capability_major() {
  int dev = 0, major = 0;
  STRATA_CHECK_CUDA(cudaGetDevice(&dev));
  STRATA_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
}

// The tile for this call, after the checks; throws ConfigError naming the fix.
int checked_tile(const void* a, const void* b, DType t, int d, int H) {
  const int hd = d / H;
  std::string why = attention_mma_refusal(hd, t);
  if (why.empty()) why = attention_mma_gpu_refusal(hd);
  if (!why.empty()) throw ConfigError(why);
  // 16-byte loads of rows that start hd (a multiple of 16) elements apart.
  STRATA_CHECK(reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0,
               "the mma attention's 16-bit operands must be 16-byte aligned");
  return attention_mma_tile(hd, static_cast<uint64_t>(max_shared_bytes()));
}

}  // namespace

std::string attention_mma_gpu_refusal(int head_dim) {
  if (compute_capability_major() < 8)
    return "STRATA_ATTENTION=mma needs a GPU of compute capability 8.0 (Ampere) or newer for bf16 tensor cores; "
           "set STRATA_ATTENTION=gemm (the default)";
  const int limit = max_shared_bytes();
  if (attention_mma_tile(head_dim, static_cast<uint64_t>(limit)) == 0)
    return "STRATA_ATTENTION=mma at head dimension " + std::to_string(head_dim) + " needs " +
           std::to_string(attention_mma_most_bytes(32, head_dim)) +
           " bytes of shared memory per block, more than this GPU's " + std::to_string(limit) +
           "; set STRATA_ATTENTION=gemm (the default), or use more heads";
  return "";
}

void attention_mma_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                           cudaStream_t s) {
  const int bt = checked_tile(qkv, out, t, d, H), hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  with_shape(t, bt, hd, [&](auto shape) {
    using Sh = decltype(shape);
    const AttentionMmaLayout lay = attention_mma_layout(AttentionMmaKernel::Forward, Sh::BT, hd);
    const auto kernel = attention_mma_forward_kernel<Sh::BT, Sh::NF, typename Sh::S>;
    allow_shared(kernel, lay.bytes);
    const dim3 grid((T + Sh::BT - 1) / Sh::BT, static_cast<unsigned>(B * H));
    kernel<<<grid, 2 * Sh::BT, lay.bytes, s>>>(static_cast<const uint16_t*>(qkv), static_cast<uint16_t*>(out), lse,
                                               T, d, H, scale, lay);
    STRATA_CHECK_CUDA(cudaGetLastError());
  });
}

void attention_mma_backward(const void* qkv, DType t, const float* lse, const void* dout, float* dqkv,
                            const float* dotp, int B, int T, int d, int H, cudaStream_t s) {
  const int bt = checked_tile(qkv, dout, t, d, H), hd = d / H;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  with_shape(t, bt, hd, [&](auto shape) {
    using Sh = decltype(shape);
    const AttentionMmaLayout dq = attention_mma_layout(AttentionMmaKernel::Dq, Sh::BT, hd);
    const AttentionMmaLayout dkv = attention_mma_layout(AttentionMmaKernel::Dkv, Sh::BT, hd);
    const auto dq_kernel = attention_mma_dq_kernel<Sh::BT, Sh::NF, typename Sh::S>;
    const auto dkv_kernel = attention_mma_dkv_kernel<Sh::BT, Sh::NF, typename Sh::S>;
    allow_shared(dq_kernel, dq.bytes);
    allow_shared(dkv_kernel, dkv.bytes);
    const dim3 grid((T + Sh::BT - 1) / Sh::BT, static_cast<unsigned>(B * H));
    const auto* q = static_cast<const uint16_t*>(qkv);
    const auto* g = static_cast<const uint16_t*>(dout);
    dq_kernel<<<grid, 2 * Sh::BT, dq.bytes, s>>>(q, lse, g, dotp, dqkv, T, d, H, scale, dq);
    STRATA_CHECK_CUDA(cudaGetLastError());
    dkv_kernel<<<grid, 2 * Sh::BT, dkv.bytes, s>>>(q, lse, g, dotp, dqkv, T, d, H, scale, dkv);
    STRATA_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace strata::detail::cuda
