// The cpu GPT's layers (gpt_cpu.hpp): norms, linears and the gradients their backward's
// matmuls read, and causal attention.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "attention16_cpu.hpp"
#include "attention_cpu.hpp"
#include "gemm_cpu.hpp"
#include "gpt_cpu.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata {

using detail::for_row_chunks;
using detail::GemmOutput;
using detail::GradView;
using detail::ParamView;
using detail::parallel_for;

namespace detail {

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, long rows, int n) {
  const unsigned parts = detail::model_threads();
  std::vector<float> partial(static_cast<size_t>(parts) * 2 * n, 0.0f);  // per part: dw, db
  const long per = (rows + parts - 1) / parts;
  parallel_for(parts, 1, [&](long p) {
    float* pdw = partial.data() + p * 2 * n;
    float* pdb = pdw + n;
    detail::layernorm_backward_rows(dy, x, w, mean, rstd, dx, pdw, pdb, std::min(rows, p * per),
                                    std::min(rows, (p + 1) * per), n);
  });
  std::fill(dw, dw + n, 0.0f);
  std::fill(db, db + n, 0.0f);
  for (unsigned p = 0; p < parts; ++p)
    for (int i = 0; i < n; ++i) {
      dw[i] += partial[p * 2 * n + i];
      db[i] += partial[p * 2 * n + n + i];
    }
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      long rows, int n) {
  const unsigned parts = detail::model_threads();
  std::vector<float> partial(static_cast<size_t>(parts) * n, 0.0f);
  const long per = (rows + parts - 1) / parts;
  parallel_for(parts, 1, [&](long p) {
    detail::rmsnorm_backward_rows(dy, x, w, rstd, dx, partial.data() + p * n, std::min(rows, p * per),
                                  std::min(rows, (p + 1) * per), n);
  });
  std::fill(dw, dw + n, 0.0f);
  for (unsigned p = 0; p < parts; ++p)
    for (int i = 0; i < n; ++i) dw[i] += partial[p * n + i];
}

}  // namespace detail

// y = layernorm(x) over rows [0, rows), of y's type (rounded once when 16-bit).
void Gpt::Impl::layernorm(const float* x, const float* w, const float* b, TypedBuffer& y, float* mean, float* rstd,
                          long rows, int n) {
  for_row_chunks(rows, [&](long r0, long r1) {
    if (y.type == DType::F32) return detail::layernorm_rows(x, w, b, y.f32(), mean, rstd, r0, r1, n);
    std::vector<float> row(n);
    detail::layernorm_rows_16(x, w, b, y.h16(), y.type, mean, rstd, r0, r1, n, row.data());
  });
}

// y = RMSNorm(x) over rows [0, rows), of y's type (rounded once when 16-bit).
void Gpt::Impl::rmsnorm(const float* x, const float* w, TypedBuffer& y, float* rstd, long rows, int n) {
  const float eps = static_cast<float>(s.norm_eps);
  rows_into(y, rows, n, [&](long r, float* o) { detail::rmsnorm_rows(x + r * n, w, o, rstd + r, 0, 1, n, eps); });
}

// Y[M,N] = X[M,K] W[N,K]^T + b: X, W of type t, Y of type yt. W is the [N, K] matrix at
// element `off` of a block: one matmul, or one per tile (a part holding rows [r0, r1) of
// W gives Y's columns [r0, r1)), each tile acquired just before and released just after.
void Gpt::Impl::linear(const void* X, ParamView& w, uint64_t off, const float* bias, void* Y, DType yt, long M, int N,
                       int K) {
  for (const detail::RowSpan& r : w.rows(off, N, K)) {
    const uint64_t o = off + static_cast<uint64_t>(r.r0) * static_cast<uint64_t>(K);
    gemm.run(M, r.r1 - r.r0, K, {X, t, K}, {w.at(o), t, K, true}, bias ? bias + r.r0 : nullptr, shifted(Y, yt, r.r0),
             yt, N, GemmOutput::Overwrite);
    w.done(o, static_cast<uint64_t>(r.r1 - r.r0) * static_cast<uint64_t>(K));
  }
  if (lora_w) lora_forward(off, X, Y, M, N, K);
}

// sums[N] = column sums over M rows, one part of the rows per core: fn(r0, r1, part)
// adds its rows into `part` (zeroed), and the parts are added in order.
template <class Fn>
void Gpt::Impl::column_sums(float* sums, long M, int N, Fn&& fn) {
  const unsigned parts = detail::model_threads();
  const long per = (M + parts - 1) / parts;
  std::fill(col_parts.begin(), col_parts.begin() + static_cast<long>(parts) * N, 0.0f);
  parallel_for(parts, 1, [&](long p) {
    const long r0 = std::min(M, p * per), r1 = std::min(M, (p + 1) * per);
    if (r1 > r0) fn(r0, r1, col_parts.data() + p * N);
  });
  std::copy(col_parts.begin(), col_parts.begin() + N, sums);
  for (unsigned p = 1; p < parts; ++p)
    for (int j = 0; j < N; ++j) sums[j] += col_parts[p * N + j];
}

// The gradient dY [M, N] of a linear's output as its backward's matmuls read it, and
// its bias gradient db = colsum(dY) (fp32). In fp32, dY itself; in 16 bits, dY rounded
// once into `dy`, the column sums taken from the fp32 values in the same pass.
const void* Gpt::Impl::matmul_grad(const float* dY, float* db, long M, int N) {
  if (!half) {
    cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(M), N, 1.0f, dY, N, ones.data(), 1, 0.0f, db, 1);
    return dY;
  }
  column_sums(db, M, N, [&](long r0, long r1, float* part) {
    detail::round_rows_16(dY + r0 * N, dy.h16() + r0 * N, t, part, r1 - r0, N);
  });
  return dy.data();
}

// The same for the MLP's first linear, whose dY is GELU's backward of dg (the gradient
// of GELU's output, fp32 [M, N], overwritten in fp32) at the pre-GELU fc.
const void* Gpt::Impl::gelu_matmul_grad(float* dg, const float* fc, float* db, long M, int N) {
  if (!half) {
    parallel_for((M + 15) / 16, 1, [&](long c) {
      const long r0 = c * 16, r1 = std::min(M, r0 + 16);
      detail::gelu_backward(dg + r0 * N, fc + r0 * N, (r1 - r0) * N);
    });
    return matmul_grad(dg, db, M, N);
  }
  column_sums(db, M, N, [&](long r0, long r1, float* part) {
    detail::gelu_backward_16(dg + r0 * N, fc + r0 * N, dy.h16() + r0 * N, t, part, r1 - r0, N);
  });
  return dy.data();
}

// Backward of linear from dY as matmul_grad gives it: dX = dY W (fp32; skipped when
// null), dW = dY^T X (type t, overwritten).
void Gpt::Impl::linear_backward(const void* dY, const void* X, ParamView& w, uint64_t off, float* dX, GradView& g,
                                long M, int N, int K) {
  // Tile by tile: dX = sum over tiles of dY[:, r0:r1] W[r0:r1] (the first overwrites),
  // and each tile's dW, handed back as soon as it is written.
  bool first = true;
  for (const detail::RowSpan& r : w.rows(off, N, K)) {
    const uint64_t o = off + static_cast<uint64_t>(r.r0) * static_cast<uint64_t>(K);
    const uint64_t n = static_cast<uint64_t>(r.r1 - r.r0) * static_cast<uint64_t>(K);
    const void* dYt = shifted(dY, t, r.r0);
    if (dX)
      gemm.run(M, K, r.r1 - r.r0, {dYt, t, N}, {w.at(o), t, K}, nullptr, dX, DType::F32, K,
               first ? GemmOutput::Overwrite : GemmOutput::Accumulate);
    w.done(o, n);
    first = false;
    if (frozen) continue;  // LoRA: the base weights have no gradient
    gemm.run(r.r1 - r.r0, K, M, {dYt, t, N, true}, {X, t, K}, nullptr, g.at(o), t, K, GemmOutput::Overwrite);
    g.wrote(o, n);
  }
  if (lora_g) lora_backward(off, dY, X, dX, M, N, K);
}

// Y[:, c0:c0+n] += scale u B^T with u = X A^T [M, rank]: two thin matmuls beside the
// base's, and u kept only for this call (backward recomputes it: M x rank x K, cheap).
void Gpt::Impl::lora_forward(uint64_t off, const void* X, void* Y, long M, int N, int K) {
  const int r = s.lora.rank;
  for (const LoraSite& x : lora) {
    if (x.weight != off) continue;
    STRATA_CHECK(x.in == K && x.col0 + x.out <= N, "a LoRA adapter does not fit its linear");
    const float* A = lora_w + x.a;  // [r, K]
    const float* B = lora_w + x.b;  // [out, r]
    cpu_sgemm(false, true, M, r, K, 1.0f, static_cast<const float*>(X), K, A, K, 0.0f, lora_u.data(), r);
    cpu_sgemm(false, true, M, x.out, r, lora_scale, lora_u.data(), r, B, r, 1.0f, static_cast<float*>(Y) + x.col0, N);
  }
}

// With dYs = dY[:, c0:c0+n] and u = X A^T: dB = scale dYs^T u, du = scale dYs B,
// dA = du^T X, dX += du A.
void Gpt::Impl::lora_backward(uint64_t off, const void* dY, const void* X, float* dX, long M, int N, int K) {
  const int r = s.lora.rank;
  const float* x32 = static_cast<const float*>(X);
  const float* dys = static_cast<const float*>(dY);
  for (const LoraSite& x : lora) {
    if (x.weight != off) continue;
    const float* A = lora_w + x.a;
    const float* B = lora_w + x.b;
    float* u = lora_u.data();
    float* du = lora_du.data();
    cpu_sgemm(false, true, M, r, K, 1.0f, x32, K, A, K, 0.0f, u, r);
    cpu_sgemm(true, false, x.out, r, M, lora_scale, dys + x.col0, N, u, r, 0.0f, lora_g + x.b, r);
    cpu_sgemm(false, false, M, r, x.out, lora_scale, dys + x.col0, N, B, r, 0.0f, du, r);
    cpu_sgemm(true, false, r, K, M, 1.0f, du, r, x32, K, 0.0f, lora_g + x.a, K);
    if (dX) cpu_sgemm(false, false, M, K, r, 1.0f, du, r, A, K, 1.0f, dX, K);
  }
}

// A linear's output gradient [M, N] as its backward's matmuls read it (no bias): dY
// itself in fp32, rounded once into `dy` in 16 bits.
const void* Gpt::Impl::grad_operand(const float* dY, long M, int N) {
  if (!half) return dY;
  for_row_chunks(M, [&](long r0, long r1) { convert_from_f32(dy.at(r0, N), t, dY + r0 * N, (r1 - r0) * N); });
  return dy.data();
}

// Causal attention over a.qkv into a.att and a.lse, and its backward from dsmall (the
// output's gradient) into dqkv: the fp32 tiles, or the 16-bit panels.
void Gpt::Impl::attention_forward(BlockActs& a, int B, int T) {
  if (half)
    return detail::attention16_forward(a.qkv.h16(), a.att.h16(), t, a.lse.data(), B, T, s.d_model, s.heads,
                                       att_workspace);
  detail::attention_forward(a.qkv.f32(), a.att.f32(), a.lse.data(), B, T, s.d_model, s.heads);
}
void Gpt::Impl::attention_backward(BlockActs& a, int B, int T) {
  if (half)
    return detail::attention16_backward(a.qkv.h16(), a.att.h16(), t, a.lse.data(), dsmall.data(), dqkv.data(), B, T,
                                        s.d_model, s.heads, att_workspace);
  detail::attention_backward(a.qkv.f32(), a.att.f32(), a.lse.data(), dsmall.data(), dqkv.data(), B, T, s.d_model,
                             s.heads);
}

}  // namespace strata
