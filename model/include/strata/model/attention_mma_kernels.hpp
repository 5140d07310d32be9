// The tensor-core attention's three kernels (STRATA_ATTENTION=mma), each the body one
// thread runs, written against a small interface to the GPU (`Gpu` below) so that one
// source serves two builds: model/src/attention_mma_cuda.cu instantiates the bodies with
// CudaThread (threadIdx, mma.sync, ldmatrix, cp.async, shuffles, one instruction each)
// inside its __global__ kernels, and tests/model/test_attention_mma_emulated.cpp with a
// host emulation of a thread block (128 threads, the warp collectives emulated from the
// PTX ISA's fragment tables, cp.async landing only at its wait) that checks the kernels'
// indexing, masking, online softmax and pipelining against a double-precision attention
// on the CPU, where CI has no GPU.
//
// FlashAttention-2's algorithm on mma.sync.m16n8k16 (bf16 or fp16 operands, fp32
// accumulators), the scores of a tile kept in registers, never the [T, T] matrix. The
// mma.sync fragment layout is documented (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
// a thread holds, of a [16, 8] fp32 accumulator, rows g = lane / 4 and g + 8 at columns
// 2 (lane % 4) and + 1 (elements 0, 1 and 2, 3); of the [16, 16] A operand the same rows
// at those columns and 8 further, in pairs. So the accumulators of two adjacent 8-column
// tiles of S, rounded and packed in pairs, are the thread's A operand for the 16-wide k
// step of P V, and P goes from one product to the next in registers (as_operand).
//
// The math. Forward, one pass over the key tiles up to the diagonal: per row the running
// max m, the rescale alpha = exp(m_old - m_new) of the row sum l and of O, P = exp(s - m)
// in fp32, rounded to 16 bits for O += P V; at the end O / l is rounded once and
// lse = m + log(l) written fp32. Backward (D = rowsum(dO * O) already in dotp):
// P = exp(scale s - lse), dP = dO V^T, dS = P (dP - D) rounded to 16 bits; the dq kernel
// (a block per query tile) makes dQ = scale dS K, the dkv kernel (a block per key tile)
// dV = round(P)^T dO and dK = scale dS^T Q; all three fp32 into dqkv, each element written
// by one block: no atomics, deterministic. Exponentials are 2^x of scores pre-multiplied
// by scale * log2(e); masked probabilities are exactly 0. The cpu model rounds at other
// points (P normalised before it is rounded), so the two agree to test_gpt_cuda's 16-bit
// tolerances, not bit for bit.
//
// Tiles (attention_mma_plan.hpp): a block owns 64 rows (4 warps of 16) and visits inner
// tiles of BC = 64 or 32 rows, each copied into one of two stages while the other is
// computed on. Blocks start in grid order, so forward and dq take query tiles from the
// last (the most key tiles) and dkv key tiles from the first (the most query tiles): the
// long blocks start first and the short ones fill the tail.
//
// The Gpu interface, one object per thread (every call by all 32 lanes of a warp where it
// is a warp collective, by all 128 threads of the block where it is sync):
//   int thread(), block_x(), block_y(), blocks_x()   threadIdx.x, blockIdx.x/.y, gridDim.x
//   unsigned char* shared()                          the block's dynamic shared memory
//   void ldmatrix(uint32_t (&r)[4], const uint16_t* row, bool trans)
//       ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives row l % 8 of
//       matrix l / 8; r[i] gets of matrix i row lane / 4, columns 2 (lane % 4) and + 1
//       (trans: column lane / 4 of rows 2 (lane % 4) and + 1), the lower in the low half
//   void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
//       mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += a b
//   uint32_t pack(float lo, float hi)                two floats rounded to 16 bits, lo low
//   float ex2(float x)                               2^x (2^-inf = +0)
//   float shfl_xor(float v, int mask)                __shfl_xor_sync over the whole warp
//   void sync()                                      __syncthreads
//   void copy16(void* dst, const void* src, bool valid), copy4(...)
//       cp.async of 16 (4) bytes global -> shared; zeros where !valid (src not read)
//   void commit(), wait_all_but_newest(), wait_all()
//       cp.async.commit_group, cp.async.wait_group 1 and 0
#pragma once

#include <cmath>
#include <cstdint>

#include "strata/model/attention_mma_plan.hpp"

#if defined(__CUDACC__)
#define STRATA_MMA_BODY __device__ __forceinline__
#define STRATA_MMA_UNROLL _Pragma("unroll")
#else
#define STRATA_MMA_BODY inline
#define STRATA_MMA_UNROLL
#endif

namespace strata::mma_attention {

inline constexpr int kThreads = 32 * kMmaBlockRows / kMmaWarpRows;  // 4 warps
inline constexpr float kLog2e = 1.4426950408889634f;

// The lane's row of an A operand's x4 load (rows 0-15 at column 0, then at 8): a0 rows
// 0-7, a1 rows 8-15, a2 and a3 the same 8 columns on.
STRATA_MMA_BODY int a_row(int lane) { return lane & 15; }
STRATA_MMA_BODY int a_col(int lane) { return (lane >> 4) * 8; }
// B = M^T for a row-major M ([n, k]): M's rows 0-7 at column 0 and 8 (b0, b1 of the first
// 8-column tile), then rows 8-15 (the second). Untransposed: a pair along k is a pair
// along M's row.
STRATA_MMA_BODY int bt_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
STRATA_MMA_BODY int bt_col(int lane) { return ((lane >> 3) & 1) * 8; }
// B = M for a row-major M ([k, n]), transposed by ldmatrix: M's rows 0-7 and 8-15 at
// column 0 (b0, b1 of the first 8-column tile), then at column 8 (the second).
STRATA_MMA_BODY int b_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
STRATA_MMA_BODY int b_col(int lane) { return (lane >> 4) * 8; }

template <class Gpu>
STRATA_MMA_BODY float quad_max(Gpu& g, float v) {  // over the 4 lanes of a fragment row
  v = fmaxf(v, g.shfl_xor(v, 1));
  return fmaxf(v, g.shfl_xor(v, 2));
}
template <class Gpu>
STRATA_MMA_BODY float quad_sum(Gpu& g, float v) {
  v += g.shfl_xor(v, 1);
  return v + g.shfl_xor(v, 2);
}

// Rows t0 .. t0 + R - 1 of a head's [T, ld]-strided slice (hd 16-bit values each, 16-byte
// aligned: hd and ld are multiples of 16, the base checked by the launcher) into a
// [R, pitch] tile, 16 bytes a copy; zeros past T.
template <int R, class Gpu>
STRATA_MMA_BODY void load_tile(Gpu& g, uint16_t* tile, int pitch, const uint16_t* src, long ld, int t0, int T, int hd) {
  const int chunks = hd / 8;
  for (int i = g.thread(); i < R * chunks; i += kThreads) {
    const int r = i / chunks, c = (i - r * chunks) * 8;
    const bool in = t0 + r < T;
    g.copy16(tile + r * pitch + c, src + static_cast<long>(in ? t0 + r : t0) * ld + c, in);
  }
}

// s = A B^T for the warp: A its [16, hd] rows, B a [BC, hd] tile, both 16-bit row-major
// `pitch` apart: s[n] the fragment of B's rows 8 n .. 8 n + 7. NP >= hd / 16.
template <int BC, int NP, class Gpu>
STRATA_MMA_BODY void rows_by_tile_t(Gpu& g, float (&s)[BC / 8][4], const uint16_t* a, const uint16_t* b, int pitch,
                                    int hd, int lane) {
STRATA_MMA_UNROLL
  for (int n = 0; n < BC / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
STRATA_MMA_UNROLL
  for (int p = 0; p < NP; ++p) {
    if (16 * p < hd) {  // the same for the whole warp
      uint32_t fa[4];
      g.ldmatrix(fa, a + a_row(lane) * pitch + 16 * p + a_col(lane), false);
STRATA_MMA_UNROLL
      for (int n2 = 0; n2 < BC / 16; ++n2) {
        uint32_t fb[4];
        g.ldmatrix(fb, b + (16 * n2 + bt_row(lane)) * pitch + 16 * p + bt_col(lane), false);
        g.mma(s[2 * n2], fa, fb[0], fb[1]);
        g.mma(s[2 * n2 + 1], fa, fb[2], fb[3]);
      }
    }
  }
}

// The warp's [16, BC] fp32 fragments as the A operand of the next product, rounded to 16
// bits: k step j of 16 columns is fragments 2 j and 2 j + 1.
template <int BC, class Gpu>
STRATA_MMA_BODY void as_operand(Gpu& g, uint32_t (&a)[BC / 16][4], const float (&s)[BC / 8][4]) {
STRATA_MMA_UNROLL
  for (int j = 0; j < BC / 16; ++j) {
    a[j][0] = g.pack(s[2 * j][0], s[2 * j][1]);
    a[j][1] = g.pack(s[2 * j][2], s[2 * j][3]);
    a[j][2] = g.pack(s[2 * j + 1][0], s[2 * j + 1][1]);
    a[j][3] = g.pack(s[2 * j + 1][2], s[2 * j + 1][3]);
  }
}

// acc += A M: A the warp's [16, BC] operand (as_operand), M a [BC, hd] 16-bit tile
// (`pitch` apart): acc[f] its columns 8 f .. 8 f + 7. P V, dS K, P^T dO, dS^T Q.
template <int BC, int NP, class Gpu>
STRATA_MMA_BODY void accumulate(Gpu& g, float (&acc)[2 * NP][4], const uint32_t (&a)[BC / 16][4], const uint16_t* m,
                                int pitch, int hd, int lane) {
STRATA_MMA_UNROLL
  for (int j = 0; j < BC / 16; ++j) {
STRATA_MMA_UNROLL
    for (int p = 0; p < NP; ++p) {
      if (16 * p < hd) {
        uint32_t fb[4];
        g.ldmatrix(fb, m + (16 * j + b_row(lane)) * pitch + 16 * p + b_col(lane), true);
        g.mma(acc[2 * p], a[j], fb[0], fb[1]);
        g.mma(acc[2 * p + 1], a[j], fb[2], fb[3]);
      }
    }
  }
}

template <int N>
STRATA_MMA_BODY void zero(float (&acc)[N][4]) {
STRATA_MMA_UNROLL
  for (int f = 0; f < N; ++f) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.0f;
}

// Calls put(r, c, lo, hi) for each pair of the warp's [16, hd] fragments a thread holds:
// row r < 16 of the warp, columns c and c + 1.
template <int NP, class F>
STRATA_MMA_BODY void for_pairs(const float (&acc)[2 * NP][4], int hd, int lane, F&& put) {
  const int g = lane >> 2, c2 = 2 * (lane & 3);
STRATA_MMA_UNROLL
  for (int f = 0; f < 2 * NP; ++f) {
    if (8 * f < hd) {
      put(g, 8 * f + c2, acc[f][0], acc[f][1]);
      put(g + 8, 8 * f + c2, acc[f][2], acc[f][3]);
    }
  }
}

// The warp's [16, hd] fp32 fragments times `scale` into rows r0 .. r0 + 15 of dst (ld
// floats apart), those before T: dQ, dK, dV.
template <int NP>
STRATA_MMA_BODY void store_rows(const float (&acc)[2 * NP][4], float scale, float* dst, long ld, int r0, int T, int hd,
                                int lane) {
  for_pairs<NP>(acc, hd, lane, [&](int r, int c, float lo, float hi) {
    if (r0 + r < T) {
      float* at = dst + static_cast<long>(r0 + r) * ld + c;
      at[0] = lo * scale;
      at[1] = hi * scale;
    }
  });
}

template <class Gpu>
STRATA_MMA_BODY uint16_t* buf16(Gpu& g, uint32_t off) {
  return reinterpret_cast<uint16_t*>(g.shared() + off);
}

// Which stage of the inner buffers tile j of a range starting at `first` uses (bytes).
STRATA_MMA_BODY uint32_t stage_of(int j, int first, const AttentionMmaLayout& lay) {
  return static_cast<uint32_t>(j - first) % kMmaStages * lay.stage_bytes;
}

// The top of inner tile j's iteration (of the range r): load(j + 1, stage) issues the
// copies of the next tile into its stage, then this tile's copies are waited for and the
// block meets, so every thread's copies are visible to all; returns tile j's stage. The
// caller meets the block again after its last read of the stage, before the copies of
// tile j + 2 go into it.
template <class Gpu, class Load>
STRATA_MMA_BODY uint32_t inner_tile_ready(Gpu& g, const AttentionMmaLayout& lay, int j, const MmaRange& r, Load&& load) {
  if (j + 1 < r.end) load(j + 1, stage_of(j + 1, r.first, lay));
  g.commit();
  g.wait_all_but_newest();  // tile j's group (and the own tiles') landed; the next may be in flight
  g.sync();
  return stage_of(j, r.first, lay);
}

// grid (query tiles of 64, B*H), 128 threads. qkv [B*T, 3d] 16-bit, out [B*T, d] 16-bit,
// lse [B*H, T] fp32 (natural log).
template <int BC, int NP, class Gpu>
STRATA_MMA_BODY void forward(Gpu& g, const uint16_t* qkv, uint16_t* out, float* lse, int T, int d, int H, float scale,
                             const AttentionMmaLayout& lay) {
  const int hd = d / H, ph = lay.pitch16, lane = g.thread() % 32, warp = g.thread() / 32;
  const int bh = g.block_y(), b = bh / H, h = bh % H;
  const int qt = g.blocks_x() - 1 - g.block_x(), q0 = qt * kMmaBlockRows;  // longest first
  const int qa = q0 + kMmaWarpRows * warp + lane / 4, qb = qa + 8;           // the thread's two rows
  const long ld = 3L * d;
  const uint16_t* base = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  uint16_t* Qs = buf16(g, lay.q);
  const uint16_t* Qw = Qs + kMmaWarpRows * warp * ph;
  const MmaRange keys = attention_mma_inner_tiles(AttentionMmaKernel::Forward, qt, BC, T);
  const auto load_keys = [&](int j, uint32_t at) {  // key tile j's K and V into stage `at`
    load_tile<BC>(g, buf16(g, lay.k + at), ph, base + d, ld, j * BC, T, hd);
    load_tile<BC>(g, buf16(g, lay.v + at), ph, base + 2 * d, ld, j * BC, T, hd);
  };
  load_tile<kMmaBlockRows>(g, Qs, ph, base, ld, q0, T, hd);
  load_keys(keys.first, 0);
  g.commit();

  const float sl2 = scale * kLog2e;  // scores in units of log2
  float o[2 * NP][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows qa, qb; l this thread's part
  for (int j = keys.first; j < keys.end; ++j) {
    const uint32_t stage = inner_tile_ready(g, lay, j, keys, load_keys);
    float s[BC / 8][4];
    rows_by_tile_t<BC, NP>(g, s, Qw, buf16(g, lay.k + stage), ph, hd, lane);
    const int k0 = j * BC;
    if (attention_mma_pair(q0, kMmaBlockRows, k0, BC, T) != MmaTileVisit::Whole) {
STRATA_MMA_UNROLL
      for (int n = 0; n < BC / 8; ++n)
STRATA_MMA_UNROLL
        for (int e = 0; e < 4; ++e)
          if (k0 + 8 * n + 2 * (lane & 3) + (e & 1) > (e < 2 ? qa : qb)) s[n][e] = -INFINITY;
    }
    float mx[2] = {m[0], m[1]};
STRATA_MMA_UNROLL
    for (int n = 0; n < BC / 8; ++n) {
      mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
    float base2[2], alpha[2];
STRATA_MMA_UNROLL
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(g, mx[r]);
      base2[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * sl2;  // a row with nothing visible yet stays at 0
      alpha[r] = g.ex2(m[r] * sl2 - base2[r]);             // 0 on a row's first visible tile
      m[r] = mx[r];
    }
    float sum[2] = {0.0f, 0.0f};
STRATA_MMA_UNROLL
    for (int n = 0; n < BC / 8; ++n)
STRATA_MMA_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[n][e] = g.ex2(fmaf(s[n][e], sl2, -base2[e >> 1]));
        sum[e >> 1] += s[n][e];
      }
STRATA_MMA_UNROLL
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
STRATA_MMA_UNROLL
    for (int f = 0; f < 2 * NP; ++f) {
      o[f][0] *= alpha[0];
      o[f][1] *= alpha[0];
      o[f][2] *= alpha[1];
      o[f][3] *= alpha[1];
    }
    uint32_t p[BC / 16][4];
    as_operand<BC>(g, p, s);
    accumulate<BC, NP>(g, o, p, buf16(g, lay.v + stage), ph, hd, lane);
    g.sync();  // every warp done with this stage before the next copy into it
  }
  g.wait_all();  // the last, empty group

  float inv[2];
STRATA_MMA_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(g, l[r]);  // > 0: key 0 is visible to every row
    inv[r] = 1.0f / l[r];
  }
  uint16_t* O = out + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
  const int r0 = q0 + kMmaWarpRows * warp;
  for_pairs<NP>(o, hd, lane, [&](int r, int c, float lo, float hi) {
    const float k = r < 8 ? inv[0] : inv[1];
    if (r0 + r < T) *reinterpret_cast<uint32_t*>(O + static_cast<long>(r0 + r) * d + c) = g.pack(lo * k, hi * k);
  });
  if ((lane & 3) == 0) {
    if (qa < T) lse[static_cast<long>(bh) * T + qa] = m[0] * scale + logf(l[0]);
    if (qb < T) lse[static_cast<long>(bh) * T + qb] = m[1] * scale + logf(l[1]);
  }
}

// dQ_q = scale sum_{k <= q} dS_qk K_k, dS_qk = round(P_qk (dO_q . V_k - D_q)). grid (query
// tiles of 64, B*H), 128 threads. dout [B*T, d] 16-bit; dotp [B*H, T] fp32 (D); dqkv
// [B*T, 3d] fp32, of which this writes the dQ columns.
template <int BC, int NP, class Gpu>
STRATA_MMA_BODY void dq(Gpu& g, const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                        float* dqkv, int T, int d, int H, float scale, const AttentionMmaLayout& lay) {
  const int hd = d / H, ph = lay.pitch16, lane = g.thread() % 32, warp = g.thread() / 32;
  const int bh = g.block_y(), b = bh / H, h = bh % H;
  const int qt = g.blocks_x() - 1 - g.block_x(), q0 = qt * kMmaBlockRows;  // longest first
  const int qa = q0 + kMmaWarpRows * warp + lane / 4, qb = qa + 8;
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const uint16_t* base = qkv + qoff;
  uint16_t* Qs = buf16(g, lay.q);
  uint16_t* dOs = buf16(g, lay.dout);
  const MmaRange keys = attention_mma_inner_tiles(AttentionMmaKernel::Dq, qt, BC, T);
  const auto load_keys = [&](int j, uint32_t at) {
    load_tile<BC>(g, buf16(g, lay.k + at), ph, base + d, ld, j * BC, T, hd);
    load_tile<BC>(g, buf16(g, lay.v + at), ph, base + 2 * d, ld, j * BC, T, hd);
  };
  load_tile<kMmaBlockRows>(g, Qs, ph, base, ld, q0, T, hd);
  load_tile<kMmaBlockRows>(g, dOs, ph, dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd, d, q0, T, hd);
  load_keys(keys.first, 0);
  g.commit();
  const float sl2 = scale * kLog2e;
  // lse in units of log2. Rows past T take 0 and D 0: their Q and dO are zeros, so their
  // dS is 0 and finite, and they are never stored.
  const float L[2] = {qa < T ? lse[static_cast<long>(bh) * T + qa] * kLog2e : 0.0f,
                      qb < T ? lse[static_cast<long>(bh) * T + qb] * kLog2e : 0.0f};
  const float D[2] = {qa < T ? dotp[static_cast<long>(bh) * T + qa] : 0.0f,
                      qb < T ? dotp[static_cast<long>(bh) * T + qb] : 0.0f};
  const uint16_t* Qw = Qs + kMmaWarpRows * warp * ph;
  const uint16_t* dOw = dOs + kMmaWarpRows * warp * ph;
  float acc[2 * NP][4];
  zero(acc);
  for (int j = keys.first; j < keys.end; ++j) {
    const uint32_t stage = inner_tile_ready(g, lay, j, keys, load_keys);
    const uint16_t* Ks = buf16(g, lay.k + stage);
    float s[BC / 8][4], dp[BC / 8][4];
    rows_by_tile_t<BC, NP>(g, s, Qw, Ks, ph, hd, lane);
    rows_by_tile_t<BC, NP>(g, dp, dOw, buf16(g, lay.v + stage), ph, hd, lane);
    const int k0 = j * BC;
    const bool whole = attention_mma_pair(q0, kMmaBlockRows, k0, BC, T) == MmaTileVisit::Whole;
STRATA_MMA_UNROLL
    for (int n = 0; n < BC / 8; ++n)
STRATA_MMA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const bool seen = whole || k0 + 8 * n + 2 * (lane & 3) + (e & 1) <= (e < 2 ? qa : qb);
        const float p = seen ? g.ex2(fmaf(s[n][e], sl2, -L[e >> 1])) : 0.0f;
        s[n][e] = p * (dp[n][e] - D[e >> 1]);  // dS
      }
    uint32_t ds[BC / 16][4];
    as_operand<BC>(g, ds, s);
    accumulate<BC, NP>(g, acc, ds, Ks, ph, hd, lane);
    g.sync();
  }
  g.wait_all();
  store_rows<NP>(acc, scale, dqkv + qoff, ld, q0 + kMmaWarpRows * warp, T, hd, lane);  // dQ
}

// dV_k = sum_{q >= k} round(P_qk) dO_q and dK_k = scale sum_{q >= k} dS_qk Q_q, with the
// scores transposed (rows are keys): S^T = K Q^T, dP^T = V dO^T. grid (key tiles of 64,
// B*H), 128 threads; writes the dK and dV columns of dqkv.
template <int BC, int NP, class Gpu>
STRATA_MMA_BODY void dkv(Gpu& g, const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                         float* dqkv, int T, int d, int H, float scale, const AttentionMmaLayout& lay) {
  const int hd = d / H, ph = lay.pitch16, lane = g.thread() % 32, warp = g.thread() / 32;
  const int bh = g.block_y(), b = bh / H, h = bh % H, kt = g.block_x(), k0 = kt * kMmaBlockRows;
  const int ka = k0 + kMmaWarpRows * warp + lane / 4, kb = ka + 8;  // the thread's two keys
  const long ld = 3L * d;
  const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
  const uint16_t* base = qkv + qoff;
  const uint16_t* dObase = dout + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
  const float* lse_row = lse + static_cast<long>(bh) * T;
  const float* dot_row = dotp + static_cast<long>(bh) * T;
  uint16_t* Ks = buf16(g, lay.k);
  uint16_t* Vs = buf16(g, lay.v);
  const MmaRange queries = attention_mma_inner_tiles(AttentionMmaKernel::Dkv, kt, BC, T);
  // Query tile j's Q, dO, lse and D into stage `at`; zeros past T.
  const auto load_queries = [&](int j, uint32_t at) {
    load_tile<BC>(g, buf16(g, lay.q + at), ph, base, ld, j * BC, T, hd);
    load_tile<BC>(g, buf16(g, lay.dout + at), ph, dObase, d, j * BC, T, hd);
    float* st = reinterpret_cast<float*>(g.shared() + lay.stats + at);
    for (int i = g.thread(); i < BC; i += kThreads) {
      const int q = j * BC + i;
      const bool in = q < T;
      g.copy4(st + i, lse_row + (in ? q : 0), in);
      g.copy4(st + BC + i, dot_row + (in ? q : 0), in);
    }
  };
  load_tile<kMmaBlockRows>(g, Ks, ph, base + d, ld, k0, T, hd);
  load_tile<kMmaBlockRows>(g, Vs, ph, base + 2 * d, ld, k0, T, hd);
  load_queries(queries.first, 0);
  g.commit();
  const float sl2 = scale * kLog2e;
  const uint16_t* Kw = Ks + kMmaWarpRows * warp * ph;
  const uint16_t* Vw = Vs + kMmaWarpRows * warp * ph;
  float dk[2 * NP][4], dv[2 * NP][4];
  zero(dk);
  zero(dv);
  for (int j = queries.first; j < queries.end; ++j) {
    const uint32_t stage = inner_tile_ready(g, lay, j, queries, load_queries);
    const uint16_t* Qs = buf16(g, lay.q + stage);
    const uint16_t* dOs = buf16(g, lay.dout + stage);
    const float* Ls = reinterpret_cast<const float*>(g.shared() + lay.stats + stage);
    const float* Ds = Ls + BC;
    float s[BC / 8][4], dp[BC / 8][4];
    rows_by_tile_t<BC, NP>(g, s, Kw, Qs, ph, hd, lane);
    rows_by_tile_t<BC, NP>(g, dp, Vw, dOs, ph, hd, lane);
    const int q0 = j * BC;
    const bool whole = attention_mma_pair(q0, BC, k0, kMmaBlockRows, T) == MmaTileVisit::Whole;
STRATA_MMA_UNROLL
    for (int n = 0; n < BC / 8; ++n)
STRATA_MMA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * (lane & 3) + (e & 1), q = q0 + c;  // column c: query q
        const bool seen = whole || ((e < 2 ? ka : kb) <= q && q < T);
        const float p = seen ? g.ex2(fmaf(s[n][e], sl2, -Ls[c] * kLog2e)) : 0.0f;
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Ds[c]);  // dS^T
      }
    uint32_t a[BC / 16][4];
    as_operand<BC>(g, a, s);
    accumulate<BC, NP>(g, dv, a, dOs, ph, hd, lane);
    as_operand<BC>(g, a, dp);
    accumulate<BC, NP>(g, dk, a, Qs, ph, hd, lane);
    g.sync();
  }
  g.wait_all();
  const int r0 = k0 + kMmaWarpRows * warp;
  store_rows<NP>(dk, scale, dqkv + qoff + d, ld, r0, T, hd, lane);
  store_rows<NP>(dv, 1.0f, dqkv + qoff + 2 * d, ld, r0, T, hd, lane);  // x 1: exact
}

}  // namespace strata::mma_attention
