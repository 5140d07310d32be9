#include "attention16_cpu.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "gemm_cpu.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/half.hpp"

#include "strata/core/target_clones.hpp"

namespace strata::detail {

namespace {

constexpr int kPanel = 64;  // query rows per panel

// ---- Tile matmuls over 16-bit values taken in pairs along the inner dimension ----
//
// C[m, n] (+)= A[m, kp] B[kp, n], where each element of A and B is a pair of 16-bit
// values (two consecutive values of the inner dimension) and an element product is the
// pair's dot product: the unit AVX512-BF16's vdpbf16ps multiplies. Operands are arrays
// of values (Elem), a pair being two consecutive ones; strides count pairs. B is [kp, n]
// row-major, ldb pairs apart; A's pair (r, p) is at pair r * a_rs + p * a_ps, so A can be
// read transposed. An odd inner dimension is padded with a zero on both sides.

// bf16 bits, multiplied by vdpbf16ps (exact products, fp32 sums).
struct Bf16Pairs {
  using Elem = uint16_t;
  static Elem from_bits(uint16_t bits) { return bits; }
  static Elem from_float(float x) { return math::float_to_bf16(x); }
  static float value(Elem e) { return math::bf16_to_float(e); }
  static uint16_t round(float x) { return math::float_to_bf16(x); }
  static void mma(int m, int n, int kp, const Elem* A, long a_rs, long a_ps, const Elem* B, long ldb, float* C,
                  long ldc, bool accumulate);
};

// The same 16-bit values held as floats, multiplied with fp32 arithmetic (the same exact
// products and fp32 sums): fp16, and bf16 on a CPU without bf16 instructions.
void mma_float_pairs(int m, int n, int kp, const float* A, long a_rs, long a_ps, const float* B, long ldb, float* C,
                     long ldc, bool accumulate);

// fp16 values as floats, without branches (half.hpp's conversions loop over subnormals
// and do not vectorise): the same values as math::fp16_to_float(bits) and as
// math::fp16_to_float(math::float_to_fp16(x)), NaN aside (any NaN stays a NaN).
STRATA_FORCE_INLINE float fp16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  const float sub = static_cast<float>(m) * 0x1p-24f;  // e == 0: m * 2^-24, exact
  const uint32_t bits = e == 0 ? std::bit_cast<uint32_t>(sub) : e == 31 ? 0x7F800000u | (m << 13) : ((e + 112) << 23) | (m << 13);
  return std::bit_cast<float>(sign | bits);
}

STRATA_FORCE_INLINE float fp16_rounded(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x), a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
  // Normal fp16 (|x| >= 2^-14): round to nearest even at 10 fraction bits; 65520 and up
  // (the halfway point past the largest fp16, 65504) are infinite.
  const uint32_t normal = a >= 0x477FF000u ? 0x7F800000u : (a + 0x0FFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
  // Subnormal fp16: a multiple of 2^-24, rounded to nearest even by adding and taking
  // away 0.75 (whose ulp is 2^-24; |x| < 2^-14 keeps the sum within its binade).
  const float small = (std::bit_cast<float>(a) + 0.75f) - 0.75f;
  const uint32_t r = a > 0x7F800000u ? a : a >= 0x38800000u ? normal : std::bit_cast<uint32_t>(small);
  return std::bit_cast<float>(sign | r);
}

template <DType T>
struct FloatPairs {
  using Elem = float;
  static float from_bits(uint16_t bits) { return T == DType::BF16 ? math::bf16_to_float(bits) : fp16_value(bits); }
  static float from_float(float x) { return T == DType::BF16 ? math::bf16_to_float(math::float_to_bf16(x)) : fp16_rounded(x); }
  static float value(Elem e) { return e; }
  static uint16_t round(float x) { return T == DType::BF16 ? math::float_to_bf16(x) : math::float_to_fp16(x); }
  static void mma(int m, int n, int kp, const Elem* A, long a_rs, long a_ps, const Elem* B, long ldb, float* C,
                  long ldc, bool accumulate) {
    mma_float_pairs(m, n, kp, A, a_rs, a_ps, B, ldb, C, ldc, accumulate);
  }
};

// MR rows of C times 16 columns; the compiler vectorises the columns (the pairs of a B
// row split into its first and second values by permutes). Edge columns take
// mma_float_pairs_edge.
template <int MR>
STRATA_FORCE_INLINE void mma_float_pairs_rows(int kp, const float* A, long a_rs, long a_ps, const float* B, long ldb,
                                              float* C, long ldc, bool accumulate) {
  float acc[MR][16], lo[16], hi[16];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 16; ++j) acc[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
  for (int p = 0; p < kp; ++p) {
    const float* b = B + 2 * p * ldb;
    for (int j = 0; j < 16; ++j) {
      lo[j] = b[2 * j];
      hi[j] = b[2 * j + 1];
    }
    for (int r = 0; r < MR; ++r) {
      const float alo = A[2 * (r * a_rs + p * a_ps)], ahi = A[2 * (r * a_rs + p * a_ps) + 1];
#pragma omp simd
      for (int j = 0; j < 16; ++j) acc[r][j] += alo * lo[j] + ahi * hi[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 16; ++j) C[r * ldc + j] = acc[r][j];
}

// One element of C at a time, for the last columns when n is not a multiple of 16.
STRATA_FORCE_INLINE void mma_float_pairs_edge(int m, int n, int kp, const float* A, long a_rs, long a_ps,
                                              const float* B, long ldb, float* C, long ldc, bool accumulate) {
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < n; ++j) {
      float acc = accumulate ? C[r * ldc + j] : 0.0f;
      for (int p = 0; p < kp; ++p)
        acc += A[2 * (r * a_rs + p * a_ps)] * B[2 * (p * ldb + j)] +
               A[2 * (r * a_rs + p * a_ps) + 1] * B[2 * (p * ldb + j) + 1];
      C[r * ldc + j] = acc;
    }
}

STRATA_CLONES void mma_float_pairs(int m, int n, int kp, const float* A, long a_rs, long a_ps, const float* B,
                                   long ldb, float* C, long ldc, bool accumulate) {
  const int n16 = n / 16 * 16;
  for (int j0 = 0; j0 < n16; j0 += 16) {
    for (int i0 = 0; i0 < m; i0 += 4) {
      const float* a = A + 2 * i0 * a_rs;
      const float* b = B + 2 * j0;
      float* c = C + i0 * ldc + j0;
      switch (std::min(4, m - i0)) {
        case 4: mma_float_pairs_rows<4>(kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 3: mma_float_pairs_rows<3>(kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 2: mma_float_pairs_rows<2>(kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        default: mma_float_pairs_rows<1>(kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
      }
    }
  }
  if (n16 < n) mma_float_pairs_edge(m, n - n16, kp, A, a_rs, a_ps, B + 2 * n16, ldb, C + n16, ldc, accumulate);
}

#if defined(__x86_64__)
#define STRATA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// MR rows of C times 32 columns (nr of them valid): 2 * MR accumulators in registers.
template <int MR>
STRATA_BF16_TARGET inline void mma_bf16_rows(int nr, int kp, const uint16_t* A, long a_rs, long a_ps,
                                             const uint16_t* B, long ldb, float* C, long ldc, bool accumulate) {
  const __mmask16 k0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 k1 = nr <= 16 ? 0 : nr >= 32 ? 0xFFFF : static_cast<__mmask16>((1u << (nr - 16)) - 1);
  const __mmask16 l0 = accumulate ? k0 : 0, l1 = accumulate ? k1 : 0;
  __m512 c0[MR], c1[MR];
  // Unrolled before scalar replacement, so the accumulators live in registers.
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm512_maskz_loadu_ps(l0, C + r * ldc);
    c1[r] = _mm512_maskz_loadu_ps(l1, C + r * ldc + 16);
  }
  for (int p = 0; p < kp; ++p) {
    const uint16_t* b = B + 2 * p * ldb;
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(k0, b));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(k1, b + 32));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int pair;
      std::memcpy(&pair, A + 2 * (r * a_rs + p * a_ps), sizeof pair);
      const auto a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, k0, c0[r]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, k1, c1[r]);
  }
}

STRATA_BF16_TARGET void Bf16Pairs::mma(int m, int n, int kp, const Elem* A, long a_rs, long a_ps, const Elem* B,
                                       long ldb, float* C, long ldc, bool accumulate) {
  // Column blocks outside, rows inside: a [kp, 32] block of B stays in L1 across the rows.
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int nr = std::min(32, n - j0);
    const uint16_t* b = B + 2 * j0;
    for (int i0 = 0; i0 < m; i0 += 8) {
      const uint16_t* a = A + 2 * i0 * a_rs;
      float* c = C + i0 * ldc + j0;
      switch (std::min(8, m - i0)) {
        case 8: mma_bf16_rows<8>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 7: mma_bf16_rows<7>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 6: mma_bf16_rows<6>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 5: mma_bf16_rows<5>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 4: mma_bf16_rows<4>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 3: mma_bf16_rows<3>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        case 2: mma_bf16_rows<2>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
        default: mma_bf16_rows<1>(nr, kp, a, a_rs, a_ps, b, ldb, c, ldc, accumulate); break;
      }
    }
  }
}
#endif

// ---- Operands in pairs ----

// Pairs along rows: dst row r holds X[r][0, cols) (and a zero when cols is odd), ld pairs
// apart. `get(r, c)` gives X[r][c] as an Elem.
template <class E, class Get>
STRATA_FORCE_INLINE void row_pairs(E* dst, long ld, int rows, int cols, Get&& get) {
  for (int r = 0; r < rows; ++r) {
    E* d = dst + 2 * r * ld;
    for (int c = 0; c < cols; ++c) d[c] = get(r, c);
    if (cols % 2) d[cols] = E{};
  }
}

// Pairs down columns: dst pair (q, c) = (X[2q][c], X[2q+1][c]), ld pairs apart; a missing
// last row is zero.
template <class E, class Get>
STRATA_FORCE_INLINE void column_pairs(E* dst, long ld, int rows, int cols, Get&& get) {
  for (int q = 0; 2 * q + 1 < rows; ++q) {
    E* d = dst + 2 * q * ld;
    for (int c = 0; c < cols; ++c) {
      d[2 * c] = get(2 * q, c);
      d[2 * c + 1] = get(2 * q + 1, c);
    }
  }
  if (rows % 2) {
    E* d = dst + (rows - 1) * ld;
    for (int c = 0; c < cols; ++c) {
      d[2 * c] = get(rows - 1, c);
      d[2 * c + 1] = E{};
    }
  }
}

// Pairs along rows, transposed: dst pair (q, r) = (X[r][2q], X[r][2q+1]), ld pairs apart.
template <class E, class Get>
STRATA_FORCE_INLINE void row_pairs_transposed(E* dst, long ld, int rows, int cols, Get&& get) {
  for (int r = 0; r < rows; ++r) {
    for (int q = 0; 2 * q + 1 < cols; ++q) {
      dst[2 * (q * ld + r)] = get(r, 2 * q);
      dst[2 * (q * ld + r) + 1] = get(r, 2 * q + 1);
    }
    if (cols % 2) {
      dst[2 * (cols / 2 * ld + r)] = get(r, cols - 1);
      dst[2 * (cols / 2 * ld + r) + 1] = E{};
    }
  }
}

// One core's working memory for a (sequence, head), laid out over part of the caller's
// workspace: the packed q, k, v and one panel's scores and gradients. Sizes in pairs;
// each pair is two Elems.
template <class P>
struct Scratch {
  using E = typename P::Elem;
  int T, hd, hp, tp;   // tokens, head size, head pairs (hd + 1) / 2, token pairs (T + 1) / 2
  long lds;            // floats per row of a [kPanel, T] panel (T rounded up to even)
  std::span<E> qa, kt, vv;        // [T, hp] q along the head; [hp, lds] k along the head; [tp, hd] v down the tokens
  std::span<E> vt, kv, qv;        // backward: [hp, lds] v along the head; [tp, hd] k and q down the tokens
  std::span<float> s, dp;         // [kPanel, lds] scores / probabilities, and dP / dS
  std::span<E> pa, pv, dsa, dsv;  // [kPanel, tp] P / dS along the keys; [kPanel/2, lds] P / dS down the queries
  std::span<E> doa, dov;          // [kPanel, hp] dO along the head; [kPanel/2, hd] down the queries
  std::span<float> o, d;          // [kPanel, hd] a panel's output; [T] rowsum(dO * O)
  std::span<float> dk, dv;        // [T, hd] dK, dV summed over the panels (contiguous, unlike dqkv's rows)

  Scratch(int T_, int hd_) : T(T_), hd(hd_), hp((hd_ + 1) / 2), tp((T_ + 1) / 2), lds(2L * tp) {}

  // Lays the buffers out from `base` (null: only counts); returns the bytes they take.
  size_t lay_out(std::byte* base) {
    size_t used = 0;
    auto take = [&]<class T>(std::span<T>& v, long n) {
      used = (used + 63) / 64 * 64;  // each buffer on cache lines of its own
      if (base) v = std::span<T>(reinterpret_cast<T*>(base + used), static_cast<size_t>(n));
      used += static_cast<size_t>(n) * sizeof(T);
    };
    auto pairs = [&](std::span<E>& v, long n) { take(v, 2 * n); };
    pairs(qa, static_cast<long>(T) * hp);
    pairs(kt, hp * lds);
    pairs(vv, static_cast<long>(tp) * hd);
    pairs(vt, hp * lds);
    pairs(kv, static_cast<long>(tp) * hd);
    pairs(qv, static_cast<long>(tp) * hd);
    take(s, kPanel * lds);
    take(dp, kPanel * lds);
    pairs(pa, static_cast<long>(kPanel) * tp);
    pairs(pv, kPanel / 2 * lds);
    pairs(dsa, static_cast<long>(kPanel) * tp);
    pairs(dsv, kPanel / 2 * lds);
    pairs(doa, static_cast<long>(kPanel) * hp);
    pairs(dov, static_cast<long>(kPanel / 2) * hd);
    take(o, static_cast<long>(kPanel) * hd);
    take(d, T);
    take(dk, static_cast<long>(T) * hd);
    take(dv, static_cast<long>(T) * hd);
    return (used + 63) / 64 * 64;
  }
};

// Dot products of queries [q0, q0 + nq) with keys [0, nk): s = q k^T (fp32 sums); the
// scale is applied as the exponentials are taken.
template <class P>
void scores(Scratch<P>& w, int q0, int nq, int nk) {
  P::mma(nq, nk, w.hp, w.qa.data() + 2L * q0 * w.hp, w.hp, 1, w.kt.data(), w.lds, w.s.data(), w.lds, false);
}

template <class P>
STRATA_FORCE_INLINE void forward_head(Scratch<P>& w, const uint16_t* Q, const uint16_t* K, const uint16_t* V, long ld, uint16_t* O,
                  long ldo, float* L, float scale) {
  using E = typename P::Elem;
  const int T = w.T, hd = w.hd;
  auto bits = [&](const uint16_t* X) { return [X, ld](int r, int c) { return P::from_bits(X[r * ld + c]); }; };
  row_pairs<E>(w.qa.data(), w.hp, T, hd, bits(Q));
  row_pairs_transposed<E>(w.kt.data(), w.lds, T, hd, bits(K));
  column_pairs<E>(w.vv.data(), hd, T, hd, bits(V));
  for (int q0 = 0; q0 < T; q0 += kPanel) {
    const int nq = std::min(kPanel, T - q0), nk = q0 + nq, nkp = (nk + 1) / 2;
    scores(w, q0, nq, nk);
    // P = softmax of the scaled scores over the visible keys 0 .. q0+i in fp32, rounded
    // for P V. (scale > 0, so the max of the scaled scores is the scaled max.)
    for (int i = 0; i < nq; ++i) {
      float* s = w.s.data() + i * w.lds;
      const int valid = q0 + i + 1;
      const float mx = scale * max_of(s, valid);
      const double sum = exp_scaled(s, s, valid, scale, mx);
      L[q0 + i] = mx + static_cast<float>(std::log(sum));
      const float inv = static_cast<float>(1.0 / sum);
      E* pa = w.pa.data() + 2L * i * w.tp;
      for (int j = 0; j < valid; ++j) pa[j] = P::from_float(s[j] * inv);
      std::fill(pa + valid, pa + 2 * nkp, E{});
    }
    P::mma(nq, hd, nkp, w.pa.data(), w.tp, 1, w.vv.data(), hd, w.o.data(), hd, false);
    for (int i = 0; i < nq; ++i)
      for (int c = 0; c < hd; ++c) O[(q0 + i) * ldo + c] = P::round(w.o[i * hd + c]);
  }
}

template <class P>
STRATA_FORCE_INLINE void backward_head(Scratch<P>& w, const uint16_t* Q, const uint16_t* K, const uint16_t* V, long ld, const uint16_t* O,
                   const float* dO, long ldo, const float* L, float* dQ, float* dK, float* dV, long ldg, float scale) {
  using E = typename P::Elem;
  const int T = w.T, hd = w.hd;
  auto bits = [&](const uint16_t* X) { return [X, ld](int r, int c) { return P::from_bits(X[r * ld + c]); }; };
  row_pairs<E>(w.qa.data(), w.hp, T, hd, bits(Q));
  row_pairs_transposed<E>(w.kt.data(), w.lds, T, hd, bits(K));
  row_pairs_transposed<E>(w.vt.data(), w.lds, T, hd, bits(V));
  column_pairs<E>(w.kv.data(), hd, T, hd, bits(K));
  column_pairs<E>(w.qv.data(), hd, T, hd, bits(Q));
  std::fill(w.dk.begin(), w.dk.end(), 0.0f);
  std::fill(w.dv.begin(), w.dv.end(), 0.0f);
  for (int t = 0; t < T; ++t) {
    // D = rowsum(round(dO) * O), both as the matmuls read them.
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int c = 0; c < hd; ++c) acc += P::value(P::from_float(dO[t * ldo + c])) * P::value(P::from_bits(O[t * ldo + c]));
    w.d[t] = acc;
  }
  for (int q0 = 0; q0 < T; q0 += kPanel) {
    const int nq = std::min(kPanel, T - q0), nk = q0 + nq, nqp = (nq + 1) / 2, nkp = (nk + 1) / 2;
    const float* dOp = dO + q0 * ldo;
    auto rounded = [&](const float* X, long ldx) { return [X, ldx](int r, int c) { return P::from_float(X[r * ldx + c]); }; };
    row_pairs<E>(w.doa.data(), w.hp, nq, hd, rounded(dOp, ldo));
    column_pairs<E>(w.dov.data(), hd, nq, hd, rounded(dOp, ldo));
    // P = exp(scale q k^T - lse), zero above the diagonal.
    scores(w, q0, nq, nk);
    for (int i = 0; i < nq; ++i) {
      float* p = w.s.data() + i * w.lds;
      const int valid = q0 + i + 1;
      exp_scaled(p, p, valid, scale, L[q0 + i]);
      std::fill(p + valid, p + nk, 0.0f);
    }
    // dP = round(dO) V^T ; dS = P (dP - D)
    P::mma(nq, nk, w.hp, w.doa.data(), w.hp, 1, w.vt.data(), w.lds, w.dp.data(), w.lds, false);
    for (int i = 0; i < nq; ++i) {
      const float* p = w.s.data() + i * w.lds;
      float* g = w.dp.data() + i * w.lds;
      const float di = w.d[q0 + i];
      for (int j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - di);
    }
    // dV += round(P)^T round(dO) ; dK += round(dS)^T q ; dQ = round(dS) k (dK, dQ scaled below)
    column_pairs<E>(w.pv.data(), w.lds, nq, nk, rounded(w.s.data(), w.lds));
    P::mma(nk, hd, nqp, w.pv.data(), 1, w.lds, w.dov.data(), hd, w.dv.data(), hd, true);
    column_pairs<E>(w.dsv.data(), w.lds, nq, nk, rounded(w.dp.data(), w.lds));
    P::mma(nk, hd, nqp, w.dsv.data(), 1, w.lds, w.qv.data() + static_cast<long>(q0) * hd, hd, w.dk.data(), hd, true);
    row_pairs<E>(w.dsa.data(), w.tp, nq, nk, rounded(w.dp.data(), w.lds));
    P::mma(nq, hd, nkp, w.dsa.data(), w.tp, 1, w.kv.data(), hd, dQ + q0 * ldg, ldg, false);
  }
  for (int t = 0; t < T; ++t) {
    scale_into(dQ + t * ldg, scale, hd);
    const float* k = w.dk.data() + static_cast<long>(t) * hd;
    const float* v = w.dv.data() + static_cast<long>(t) * hd;
    for (int c = 0; c < hd; ++c) {
      dK[t * ldg + c] = scale * k[c];
      dV[t * ldg + c] = v[c];
    }
  }
}

// forward_head and backward_head compiled for each pair type: bf16 pairs with the
// AVX512-BF16 target they only run on (the packing and rounding loops vectorised at that
// width too), float pairs for the running CPU (target_clones).
#define STRATA_HEAD_ARGS_FWD                                                                                    \
  const uint16_t *Q, const uint16_t *K, const uint16_t *V, long ld, uint16_t *O, long ldo, float *L, float scale
#define STRATA_HEAD_ARGS_BWD                                                                                     \
  const uint16_t *Q, const uint16_t *K, const uint16_t *V, long ld, const uint16_t *O, const float *dO, long ldo, \
      const float *L, float *dQ, float *dK, float *dV, long ldg, float scale
#if defined(__x86_64__)
STRATA_BF16_TARGET void forward_head_bf16(Scratch<Bf16Pairs>& w, STRATA_HEAD_ARGS_FWD) {
  forward_head(w, Q, K, V, ld, O, ldo, L, scale);
}
STRATA_BF16_TARGET void backward_head_bf16(Scratch<Bf16Pairs>& w, STRATA_HEAD_ARGS_BWD) {
  backward_head(w, Q, K, V, ld, O, dO, ldo, L, dQ, dK, dV, ldg, scale);
}
#endif
STRATA_CLONES void forward_head_bf16_floats(Scratch<FloatPairs<DType::BF16>>& w, STRATA_HEAD_ARGS_FWD) {
  forward_head(w, Q, K, V, ld, O, ldo, L, scale);
}
STRATA_CLONES void backward_head_bf16_floats(Scratch<FloatPairs<DType::BF16>>& w, STRATA_HEAD_ARGS_BWD) {
  backward_head(w, Q, K, V, ld, O, dO, ldo, L, dQ, dK, dV, ldg, scale);
}
STRATA_CLONES void forward_head_fp16(Scratch<FloatPairs<DType::F16>>& w, STRATA_HEAD_ARGS_FWD) {
  forward_head(w, Q, K, V, ld, O, ldo, L, scale);
}
STRATA_CLONES void backward_head_fp16(Scratch<FloatPairs<DType::F16>>& w, STRATA_HEAD_ARGS_BWD) {
  backward_head(w, Q, K, V, ld, O, dO, ldo, L, dQ, dK, dV, ldg, scale);
}
#undef STRATA_HEAD_ARGS_FWD
#undef STRATA_HEAD_ARGS_BWD

// Calls fn(scratch, b, h) for every (sequence, head), one scratch per core, each laid out
// over its share of the workspace.
template <class P, class Fn>
void for_heads(std::span<std::byte> workspace, int B, int T, int d, int H, Fn&& fn) {
  const long heads = static_cast<long>(B) * H;
  const long parts = std::min<long>(model_threads(), heads);
  const size_t each = Scratch<P>(T, d / H).lay_out(nullptr);
  STRATA_CHECK(workspace.size() >= parts * each, "attention16: workspace of " + std::to_string(workspace.size()) +
                                                     " bytes, " + std::to_string(parts * each) + " needed");
  parallel_for(parts, 1, [&](long part) {
    Scratch<P> w(T, d / H);
    w.lay_out(workspace.data() + part * each);
    for (long bh = part * heads / parts; bh < (part + 1) * heads / parts; ++bh)
      fn(w, static_cast<int>(bh / H), static_cast<int>(bh % H));
  });
}

template <class P, class Head>
void forward(Head head, const uint16_t* qkv, uint16_t* out, float* lse, int B, int T, int d, int H,
             std::span<std::byte> workspace) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  for_heads<P>(workspace, B, T, d, H, [&](Scratch<P>& w, int b, int h) {
    const uint16_t* Q = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    head(w, Q, Q + d, Q + 2 * d, ld, out + static_cast<long>(b) * T * d + static_cast<long>(h) * hd, d,
                 lse + (static_cast<long>(b) * H + h) * T, scale);
  });
}

template <class P, class Head>
void backward(Head head, const uint16_t* qkv, const uint16_t* out, const float* lse, const float* dout, float* dqkv,
              int B, int T, int d, int H, std::span<std::byte> workspace) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  for_heads<P>(workspace, B, T, d, H, [&](Scratch<P>& w, int b, int h) {
    const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    const long ooff = static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
    const uint16_t* Q = qkv + qoff;
    float* dQ = dqkv + qoff;
    head(w, Q, Q + d, Q + 2 * d, ld, out + ooff, dout + ooff, d, lse + (static_cast<long>(b) * H + h) * T, dQ,
         dQ + d, dQ + 2 * d, ld, scale);
  });
}

// bf16 runs on vdpbf16ps where the CPU has it (gemm_cpu.hpp), whichever path the
// matmuls take.
bool bf16_pairs(DType t) {
#if defined(__x86_64__)
  return t == DType::BF16 && cpu_has_bf16_dot();
#else
  return false;
#endif
}

}  // namespace

size_t attention16_workspace_bytes(DType t, int T, int hd) {
  const size_t each = bf16_pairs(t) ? Scratch<Bf16Pairs>(T, hd).lay_out(nullptr)
                                    : Scratch<FloatPairs<DType::F16>>(T, hd).lay_out(nullptr);
  return model_threads() * each;
}

void attention16_forward(const uint16_t* qkv, uint16_t* out, DType t, float* lse, int B, int T, int d, int H,
                         std::span<std::byte> workspace) {
#if defined(__x86_64__)
  if (bf16_pairs(t)) return forward<Bf16Pairs>(forward_head_bf16, qkv, out, lse, B, T, d, H, workspace);
#endif
  if (t == DType::F16)
    return forward<FloatPairs<DType::F16>>(forward_head_fp16, qkv, out, lse, B, T, d, H, workspace);
  forward<FloatPairs<DType::BF16>>(forward_head_bf16_floats, qkv, out, lse, B, T, d, H, workspace);
}

void attention16_backward(const uint16_t* qkv, const uint16_t* out, DType t, const float* lse, const float* dout,
                          float* dqkv, int B, int T, int d, int H, std::span<std::byte> workspace) {
#if defined(__x86_64__)
  if (bf16_pairs(t))
    return backward<Bf16Pairs>(backward_head_bf16, qkv, out, lse, dout, dqkv, B, T, d, H, workspace);
#endif
  if (t == DType::F16)
    return backward<FloatPairs<DType::F16>>(backward_head_fp16, qkv, out, lse, dout, dqkv, B, T, d, H, workspace);
  backward<FloatPairs<DType::BF16>>(backward_head_bf16_floats, qkv, out, lse, dout, dqkv, B, T, d, H, workspace);
}

}  // namespace strata::detail
