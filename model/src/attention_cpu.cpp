#include "attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata::detail {

namespace {

constexpr int kBlock = 64;  // query and key rows per tile: a 16 KiB tile of scores

struct Tiles {
  std::vector<float> s, p, o;  // [kBlock, kBlock] scores / probabilities, [kBlock, hd] output
  std::vector<float> m, l;     // [kBlock] running max and sum
  explicit Tiles(int hd)
      : s(kBlock * kBlock), p(kBlock * kBlock), o(static_cast<size_t>(kBlock) * hd), m(kBlock), l(kBlock) {}
};

}  // namespace

void attention_forward(const float* qkv, float* out, float* lse, int B, int T, int d, int H) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  parallel_for(static_cast<long>(B) * H, 1, [&](long bh) {
    Tiles w(hd);
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const float* Q = qkv + static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    const float* K = Q + d;
    const float* V = Q + 2 * d;
    float* O = out + static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
    float* L = lse + bh * T;
    for (int q0 = 0; q0 < T; q0 += kBlock) {
      const int nq = std::min(kBlock, T - q0);
      std::fill(w.m.begin(), w.m.begin() + nq, -std::numeric_limits<float>::infinity());
      std::fill(w.l.begin(), w.l.begin() + nq, 0.0f);
      std::fill(w.o.begin(), w.o.begin() + static_cast<long>(nq) * hd, 0.0f);
      for (int k0 = 0; k0 < q0 + nq; k0 += kBlock) {
        const int nk = std::min(kBlock, q0 + nq - k0);
        cpu_sgemm(false, true, nq, nk, hd, scale, Q + q0 * ld, ld, K + k0 * ld, ld, 0.0f, w.s.data(), kBlock, true);
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
        cpu_sgemm(false, false, nq, hd, nk, 1.0f, w.p.data(), kBlock, V + k0 * ld, ld, 1.0f, w.o.data(), hd, true);
      }
      for (int i = 0; i < nq; ++i) {
        const float inv = 1.0f / w.l[i];
        const float* o = w.o.data() + static_cast<long>(i) * hd;
        float* dst = O + static_cast<long>(q0 + i) * d;
        for (int c = 0; c < hd; ++c) dst[c] = o[c] * inv;
        L[q0 + i] = w.m[i] + std::log(w.l[i]);
      }
    }
  });
}

void attention_backward(const float* qkv, const float* out, const float* lse, const float* dout, float* dqkv, int B,
                        int T, int d, int H) {
  const int hd = d / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const long ld = 3L * d;
  parallel_for(static_cast<long>(B) * H, 1, [&](long bh) {
    std::vector<float> s(kBlock * kBlock), dp(kBlock * kBlock), D(T);
    const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
    const long qoff = static_cast<long>(b) * T * ld + static_cast<long>(h) * hd;
    const float* Q = qkv + qoff;
    const float* K = Q + d;
    const float* V = Q + 2 * d;
    float* dQ = dqkv + qoff;
    float* dK = dQ + d;
    float* dV = dQ + 2 * d;
    const long ooff = static_cast<long>(b) * T * d + static_cast<long>(h) * hd;
    const float* O = out + ooff;
    const float* dO = dout + ooff;
    const float* L = lse + bh * T;
    for (int t = 0; t < T; ++t) {
      float* rows[3] = {dQ + t * ld, dK + t * ld, dV + t * ld};
      for (float* r : rows) std::fill(r, r + hd, 0.0f);
      float acc = 0.0f;
      for (int c = 0; c < hd; ++c) acc += dO[static_cast<long>(t) * d + c] * O[static_cast<long>(t) * d + c];
      D[t] = acc;
    }
    for (int q0 = 0; q0 < T; q0 += kBlock) {
      const int nq = std::min(kBlock, T - q0);
      for (int k0 = 0; k0 < q0 + nq; k0 += kBlock) {
        const int nk = std::min(kBlock, q0 + nq - k0);
        // P = exp(scale q k^T - lse), zero above the diagonal.
        cpu_sgemm(false, true, nq, nk, hd, scale, Q + q0 * ld, ld, K + k0 * ld, ld, 0.0f, s.data(), kBlock, true);
        for (int i = 0; i < nq; ++i) {
          float* p = s.data() + i * kBlock;
          const int valid = std::max(0, std::min(nk, q0 + i - k0 + 1));
          if (valid > 0) exp_shifted(p, p, valid, L[q0 + i]);
          std::fill(p + valid, p + nk, 0.0f);
        }
        // dV += P^T dO
        cpu_sgemm(true, false, nk, hd, nq, 1.0f, s.data(), kBlock, dO + q0 * d, d, 1.0f, dV + k0 * ld, ld, true);
        // dP = dO V^T ; dS = P (dP - D)
        cpu_sgemm(false, true, nq, nk, hd, 1.0f, dO + q0 * d, d, V + k0 * ld, ld, 0.0f, dp.data(), kBlock, true);
        for (int i = 0; i < nq; ++i) {
          const float* p = s.data() + i * kBlock;
          float* g = dp.data() + i * kBlock;
          for (int j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - D[q0 + i]);
        }
        // dQ += scale dS K ; dK += scale dS^T Q
        cpu_sgemm(false, false, nq, hd, nk, scale, dp.data(), kBlock, K + k0 * ld, ld, 1.0f, dQ + q0 * ld, ld, true);
        cpu_sgemm(true, false, nk, hd, nq, scale, dp.data(), kBlock, Q + q0 * ld, ld, 1.0f, dK + k0 * ld, ld, true);
      }
    }
  });
}

}  // namespace strata::detail
