#include "attention_cpu.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/convert.hpp"

namespace strata::detail {

namespace {

constexpr int kBlock = 64;  // query and key rows per tile: a 16 KiB tile of scores

struct Tiles {
  std::vector<float> s, p, o;  // [kBlock, kBlock] scores / probabilities, [kBlock, hd] output
  std::vector<float> m, l;     // [kBlock] running max and sum
  explicit Tiles(int hd)
      : s(kBlock * kBlock), p(kBlock * kBlock), o(static_cast<size_t>(kBlock) * hd), m(kBlock), l(kBlock) {}
};

// rows x cols elements of type t, `ld` apart, to dense fp32 (ld = cols).
void rows_to_f32(float* dst, const void* src, DType t, long ld, int rows, int cols) {
  const auto* s = static_cast<const std::byte*>(src);
  const size_t es = dtype_size(t);
  for (int r = 0; r < rows; ++r) convert_to_f32(dst + static_cast<long>(r) * cols, s + r * ld * es, t, cols);
}

// One (sequence, head) forward: Q, K, V rows `ld` apart; row t of the output, o_t (hd
// floats of the unnormalised sum) and 1/l_t, go to store(t, o_t, inv).
template <class Store>
void forward_head(const float* Q, const float* K, const float* V, long ld, int T, int hd, float scale, Tiles& w,
                  float* L, Store&& store) {
  for (int q0 = 0; q0 < T; q0 += kBlock) {
    const int nq = std::min(kBlock, T - q0);
    std::fill(w.m.begin(), w.m.begin() + nq, -std::numeric_limits<float>::infinity());
    std::fill(w.l.begin(), w.l.begin() + nq, 0.0f);
    std::fill(w.o.begin(), w.o.begin() + static_cast<long>(nq) * hd, 0.0f);
    for (int k0 = 0; k0 < q0 + nq; k0 += kBlock) {
      const int nk = std::min(kBlock, q0 + nq - k0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale, Q + q0 * ld, ld, K + k0 * ld, ld, 0.0f,
                  w.s.data(), kBlock);
      for (int i = 0; i < nq; ++i) {
        float* s = w.s.data() + i * kBlock;
        float* p = w.p.data() + i * kBlock;
        const int valid = std::min(nk, q0 + i - k0 + 1);  // keys k0 .. q0+i are visible
        if (valid <= 0) {
          std::fill(p, p + nk, 0.0f);
          continue;
        }
        const float mx = std::max(w.m[i], max_of(s, valid));
        const float corr = std::exp(w.m[i] - mx);  // 0 on the first tile (m = -inf)
        const float sum = static_cast<float>(exp_shifted(s, p, valid, mx));
        std::fill(p + valid, p + nk, 0.0f);
        w.l[i] = w.l[i] * corr + sum;
        w.m[i] = mx;
        if (corr != 1.0f) {
          float* o = w.o.data() + static_cast<long>(i) * hd;
          for (int c = 0; c < hd; ++c) o[c] *= corr;
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, w.p.data(), kBlock, V + k0 * ld, ld,
                  1.0f, w.o.data(), hd);
    }
    for (int i = 0; i < nq; ++i) {
      store(q0 + i, w.o.data() + static_cast<long>(i) * hd, 1.0f / w.l[i]);
      L[q0 + i] = w.m[i] + std::log(w.l[i]);
    }
  }
}

// One (sequence, head) backward: Q, K, V rows `ld` apart, O and dO rows `ldo` apart, the
// gradients dQ, dK, dV (overwritten) rows `ldg` apart.
struct HeadGrads {
  const float *Q, *K, *V;
  long ld;
  const float *O, *dO;
  long ldo, lddo;
  float *dQ, *dK, *dV;
  long ldg;
};

void backward_head(const HeadGrads& a, const float* L, int T, int hd, float scale) {
  std::vector<float> s(kBlock * kBlock), dp(kBlock * kBlock), D(T);
  const long ld = a.ld, ldg = a.ldg, lddo = a.lddo;
  for (int t = 0; t < T; ++t) {
    float* rows[3] = {a.dQ + t * ldg, a.dK + t * ldg, a.dV + t * ldg};
    for (float* r : rows) std::fill(r, r + hd, 0.0f);
    float acc = 0.0f;
    for (int c = 0; c < hd; ++c) acc += a.dO[t * lddo + c] * a.O[t * a.ldo + c];
    D[t] = acc;
  }
  for (int q0 = 0; q0 < T; q0 += kBlock) {
    const int nq = std::min(kBlock, T - q0);
    for (int k0 = 0; k0 < q0 + nq; k0 += kBlock) {
      const int nk = std::min(kBlock, q0 + nq - k0);
      // P = exp(scale q k^T - lse), zero above the diagonal.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale, a.Q + q0 * ld, ld, a.K + k0 * ld, ld,
                  0.0f, s.data(), kBlock);
      for (int i = 0; i < nq; ++i) {
        float* p = s.data() + i * kBlock;
        const int valid = std::max(0, std::min(nk, q0 + i - k0 + 1));
        if (valid > 0) exp_shifted(p, p, valid, L[q0 + i]);
        std::fill(p + valid, p + nk, 0.0f);
      }
      // dV += P^T dO
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, nq, 1.0f, s.data(), kBlock, a.dO + q0 * lddo,
                  lddo, 1.0f, a.dV + k0 * ldg, ldg);
      // dP = dO V^T ; dS = P (dP - D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, 1.0f, a.dO + q0 * lddo, lddo, a.V + k0 * ld,
                  ld, 0.0f, dp.data(), kBlock);
      for (int i = 0; i < nq; ++i) {
        const float* p = s.data() + i * kBlock;
        float* g = dp.data() + i * kBlock;
        for (int j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - D[q0 + i]);
      }
      // dQ += scale dS K ; dK += scale dS^T Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, scale, dp.data(), kBlock, a.K + k0 * ld, ld,
                  1.0f, a.dQ + q0 * ldg, ldg);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, nq, scale, dp.data(), kBlock, a.Q + q0 * ld, ld,
                  1.0f, a.dK + k0 * ldg, ldg);
    }
  }
}

}  // namespace

void attention_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  const size_t es = dtype_size(t);
  parallel_for(static_cast<long>(B) * H, 1, [&](long bh) {
    Tiles w(hd);
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    const long ooff = static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
    float* L = lse + bh * T;
    if (t == DType::F32) {
      const float* Q = static_cast<const float*>(qkv) + qoff;
      float* O = static_cast<float*>(out) + ooff;
      forward_head(Q, Q + d, Q + 2 * d, ld, T, hd, scale, w, L, [&](int r, const float* o, float inv) {
        float* dst = O + static_cast<long>(r) * d;
        for (int c = 0; c < hd; ++c) dst[c] = o[c] * inv;
      });
      return;
    }
    // This head's q, k, v as fp32 [T, hd] each; the output row rounded once.
    std::vector<float> qkv32(3 * static_cast<size_t>(T) * hd), row(hd);
    const auto* src = static_cast<const std::byte*>(qkv) + qoff * es;
    for (int part = 0; part < 3; ++part)
      rows_to_f32(qkv32.data() + part * static_cast<long>(T) * hd, src + part * d * es, t, ld, T, hd);
    const float* Q = qkv32.data();
    auto* O = static_cast<std::byte*>(out) + ooff * es;
    forward_head(Q, Q + static_cast<long>(T) * hd, Q + 2L * T * hd, hd, T, hd, scale, w, L,
                 [&](int r, const float* o, float inv) {
                   for (int c = 0; c < hd; ++c) row[c] = o[c] * inv;
                   convert_from_f32(O + static_cast<long>(r) * d * es, t, row.data(), hd);
                 });
  });
}

void attention_backward(const void* qkv, const void* out, DType t, const float* lse, const float* dout, float* dqkv,
                        int B, int T, int d, int H) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  const size_t es = dtype_size(t);
  parallel_for(static_cast<long>(B) * H, 1, [&](long bh) {
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    const long ooff = static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
    float* dQ = dqkv + qoff;
    const float* L = lse + bh * T;
    if (t == DType::F32) {
      const float* Q = static_cast<const float*>(qkv) + qoff;
      backward_head({Q, Q + d, Q + 2 * d, ld, static_cast<const float*>(out) + ooff, dout + ooff, d, d, dQ, dQ + d,
                     dQ + 2 * d, ld},
                    L, T, hd, scale);
      return;
    }
    // This head's q, k, v and o as fp32 [T, hd] each.
    const long n = static_cast<long>(T) * hd;
    std::vector<float> f32(4 * n);
    const auto* src = static_cast<const std::byte*>(qkv) + qoff * es;
    for (int part = 0; part < 3; ++part) rows_to_f32(f32.data() + part * n, src + part * d * es, t, ld, T, hd);
    rows_to_f32(f32.data() + 3 * n, static_cast<const std::byte*>(out) + ooff * es, t, d, T, hd);
    const float* Q = f32.data();
    backward_head({Q, Q + n, Q + 2 * n, hd, Q + 3 * n, dout + ooff, hd, d, dQ, dQ + d, dQ + 2 * d, ld}, L, T, hd,
                  scale);
  });
}

}  // namespace strata::detail
