// cuda_kernel_plan.hpp on the CPU: every decision the fused cuda kernels take on the host
// (which cuBLASLt epilogue, which operands, or fallback and why; the norm kernels' grids),
// checked where CI runs, since no GPU there runs the kernels themselves.
#include "strata/model/cuda_kernel_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/model/gpt.hpp"

namespace strata {
namespace {

constexpr uint64_t kBase = 1ull << 20;  // an address 16-byte aligned

// GPT-2 124M's MLP at 8 x 1024 tokens in bf16: fc, Y[8192, 3072] = X[8192, 768] W^T + b.
EpilogueRequest fc_forward() {
  EpilogueRequest r;
  r.product = LinearProduct::ForwardGelu;
  r.M = 8192, r.N = 3072, r.K = 768;
  r.ab = r.out = DType::BF16;
  r.bias = true;
  r.out_addr = kBase, r.bias_addr = kBase + 4096, r.aux_addr = kBase + (64 << 20);
  r.aux_ld = 3072;
  return r;
}

TEST(ChooseEpilogue, ForwardBiasIsTheTransposedProductWithTheWeightFirst) {
  EpilogueRequest r = fc_forward();
  r.product = LinearProduct::Forward;
  r.out = DType::F32;
  const EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.epilogue, LtEpilogue::Bias);
  // Column-major D[N, M] = W (K x N, transposed) times X^T (K x M): the bias runs along D's rows.
  EXPECT_EQ(p.m, 3072); EXPECT_EQ(p.n, 8192); EXPECT_EQ(p.k, 768);
  EXPECT_TRUE(p.trans_a); EXPECT_FALSE(p.trans_b); EXPECT_TRUE(p.a_is_weight);
  EXPECT_EQ(p.lda, 768); EXPECT_EQ(p.ldb, 768); EXPECT_EQ(p.ldd, 3072);
  EXPECT_EQ(p.beta, 0.0f);
  r.bias = false;
  EXPECT_EQ(choose_epilogue(r).epilogue, LtEpilogue::Default);
}

TEST(ChooseEpilogue, ResidualIsBetaOneIntoAnFp32Output) {
  EpilogueRequest r = fc_forward();
  r.product = LinearProduct::Forward;
  r.out = DType::F32;
  r.residual = true;
  const EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.beta, 1.0f);
  r.out = DType::BF16;  // the residual stream is fp32
  EXPECT_TRUE(choose_epilogue(r).fallback);
}

TEST(ChooseEpilogue, GeluKeepsThePreActivationInAuxOfTheOutputsType) {
  const EpiloguePlan p = choose_epilogue(fc_forward());
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.epilogue, LtEpilogue::GeluAuxBias);
  EXPECT_EQ(p.aux_ld, 3072);
  EXPECT_EQ(p.aux_type, DType::BF16);
  EpilogueRequest f32 = fc_forward();
  f32.ab = f32.out = DType::F32;
  EXPECT_EQ(choose_epilogue(f32).epilogue, LtEpilogue::GeluAuxBias);
}

TEST(ChooseEpilogue, GeluFallsBackNamingWhatIsWrong) {
  auto reason = [](EpilogueRequest r) {
    const EpiloguePlan p = choose_epilogue(r);
    EXPECT_TRUE(p.fallback);
    return p.reason;
  };
  EpilogueRequest r = fc_forward();
  r.aux_ld = 3076;
  EXPECT_NE(reason(r).find("multiple of 8"), std::string::npos);
  r = fc_forward();
  r.aux_ld = 1024;
  EXPECT_NE(reason(r).find("smaller than its rows"), std::string::npos);
  r = fc_forward();
  r.aux_addr += 2;
  EXPECT_NE(reason(r).find("aux is not 16-byte aligned"), std::string::npos);
  r = fc_forward();
  r.out = DType::F32;  // fp32 output, bf16 operands: aux would be fp32, not what backward reads
  EXPECT_NE(reason(r).find("aux in the output's type"), std::string::npos);
  r = fc_forward();
  r.bias = false;
  EXPECT_NE(reason(r).find("needs a bias"), std::string::npos);
  r = fc_forward();
  r.bias_addr += 8;
  EXPECT_NE(reason(r).find("bias is not 16-byte aligned"), std::string::npos);
  r = fc_forward();
  r.out_addr += 6;
  EXPECT_NE(reason(r).find("output is not 16-byte aligned"), std::string::npos);
  r = fc_forward();
  r.ab = r.out = DType::F64;
  EXPECT_NE(reason(r).find("f32, bf16 or fp16"), std::string::npos);
  r = fc_forward();
  r.M = 0;
  EXPECT_NE(reason(r).find("empty"), std::string::npos);
}

// mlp_proj's backward at the same size: dY [8192, 768], W [768, 3072].
EpilogueRequest proj_backward(LinearProduct what) {
  EpilogueRequest r;
  r.product = what;
  r.M = 8192, r.N = 768, r.K = 3072;
  r.ab = DType::BF16;
  r.out = what == LinearProduct::WeightGrad ? DType::BF16 : DType::F32;
  r.out_addr = kBase, r.bias_addr = kBase + 4096;
  return r;
}

TEST(ChooseEpilogue, WeightGradientTakesTheBiasGradientFromB) {
  EpilogueRequest r = proj_backward(LinearProduct::WeightGrad);
  r.bias = true;
  const EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.epilogue, LtEpilogue::BGradB);
  // dW^T[K, N] = X^T (K x M) times dY (N x M, transposed): db sums B over k = M rows.
  EXPECT_EQ(p.m, 3072); EXPECT_EQ(p.n, 768); EXPECT_EQ(p.k, 8192);
  EXPECT_FALSE(p.trans_a); EXPECT_TRUE(p.trans_b); EXPECT_FALSE(p.a_is_weight);
  EXPECT_EQ(p.lda, 3072); EXPECT_EQ(p.ldb, 768); EXPECT_EQ(p.ldd, 3072);
  r.N = 256, r.ldy = 768, r.tiles = 3;  // a tile: dY's columns [r0, r0 + 256), pitch 768
  r.bias_addr += 512;
  const EpiloguePlan t = choose_epilogue(r);
  ASSERT_FALSE(t.fallback) << t.reason;
  EXPECT_EQ(t.n, 256); EXPECT_EQ(t.ldb, 768);
  r.whole_group = false;  // parts: the bias is handed back first, as the reference does
  EXPECT_NE(choose_epilogue(r).reason.find("in parts"), std::string::npos);
  r = proj_backward(LinearProduct::WeightGrad);
  EXPECT_EQ(choose_epilogue(r).epilogue, LtEpilogue::Default);
  r.out = DType::F32;
  EXPECT_NE(choose_epilogue(r).reason.find("weights' type"), std::string::npos);
}

TEST(ChooseEpilogue, DataGradientSumsTilesWithBetaOne) {
  EpilogueRequest r = proj_backward(LinearProduct::DataGrad);
  EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.epilogue, LtEpilogue::Default);
  EXPECT_EQ(p.m, 3072); EXPECT_EQ(p.n, 8192); EXPECT_EQ(p.k, 768);
  EXPECT_FALSE(p.trans_a); EXPECT_FALSE(p.trans_b); EXPECT_TRUE(p.a_is_weight);
  EXPECT_EQ(p.lda, 3072); EXPECT_EQ(p.ldb, 768); EXPECT_EQ(p.ldd, 3072);
  EXPECT_EQ(p.beta, 0.0f);
  r.accumulate = true;
  EXPECT_EQ(choose_epilogue(r).beta, 1.0f);
  r.ldy = 100;  // a pitch below the columns is a caller's error, never run
  EXPECT_TRUE(choose_epilogue(r).fallback);
}

TEST(ChooseEpilogue, GeluDerivativeOnlyOverTheWholeSumAndGroup) {
  EpilogueRequest r = proj_backward(LinearProduct::DataGradDGelu);
  r.out = DType::BF16;  // dfc in the operands' type, as aux
  r.aux_addr = kBase + (64 << 20), r.aux_ld = 3072;
  const EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  EXPECT_EQ(p.epilogue, LtEpilogue::DGeluBGrad);
  EXPECT_EQ(p.aux_ld, 3072);
  EXPECT_EQ(p.m, 3072);  // fc's bias gradient runs along D's rows: 4d of them
  EpilogueRequest t = r;
  t.tiles = 2;
  EXPECT_NE(choose_epilogue(t).reason.find("summed over tiles"), std::string::npos);
  t = r;
  t.whole_group = false;
  EXPECT_NE(choose_epilogue(t).reason.find("in parts"), std::string::npos);
  t = r;
  t.out = DType::F32;
  EXPECT_NE(choose_epilogue(t).reason.find("aux in the output's type"), std::string::npos);
}

// cuBLASLt's semantics as its documentation states them, on the host: column-major
// D[m, n] = op(A) op(B) (+ beta C), then the epilogue: BIAS adds bias[i] to row i of D;
// GELU_AUX_BIAS stores aux = that sum and D = gelu(aux); DGELU_BGRAD multiplies D by
// gelu'(aux) and stores bias[i] = the sum of row i of D; BGRADB stores bias[j] = the sum
// over k of op(B)[k, j] (B's reduction over the GEMM's k, one per column of D). With it
// the plans below are checked against the row-major layer they stand for: a wrong
// operand order, transpose or leading dimension gives a different product.
float gelu_ref(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
float gelu_grad_ref(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x), th = std::tanh(u);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

struct Emulated {
  std::vector<float> d, bias, aux;
};

Emulated lt_emulate(const EpiloguePlan& p, const float* a, const float* b, const std::vector<float>& c,
                    const float* bias_in, const float* aux_in, long aux_size) {
  auto A = [&](long i, long k) { return p.trans_a ? a[i * p.lda + k] : a[k * p.lda + i]; };  // op(A)[i, k]
  auto B = [&](long k, long j) { return p.trans_b ? b[k * p.ldb + j] : b[j * p.ldb + k]; };  // op(B)[k, j]
  Emulated e;
  e.d.assign(static_cast<size_t>(p.ldd * p.n), 0.0f);
  e.aux.assign(static_cast<size_t>(aux_size), 0.0f);
  if (aux_in) std::copy(aux_in, aux_in + aux_size, e.aux.begin());
  e.bias.assign(static_cast<size_t>(std::max(p.m, p.n)), 0.0f);
  for (long j = 0; j < p.n; ++j)
    for (long i = 0; i < p.m; ++i) {
      double acc = 0;
      for (long k = 0; k < p.k; ++k) acc += static_cast<double>(A(i, k)) * B(k, j);
      float v = static_cast<float>(acc) + p.beta * (c.empty() ? 0.0f : c[j * p.ldd + i]);
      if (p.epilogue == LtEpilogue::Bias) v += bias_in[i];
      if (p.epilogue == LtEpilogue::GeluAuxBias) {
        v += bias_in[i];
        e.aux[j * p.aux_ld + i] = v;
        v = gelu_ref(v);
      }
      if (p.epilogue == LtEpilogue::DGeluBGrad) {
        v *= gelu_grad_ref(e.aux[j * p.aux_ld + i]);
        e.bias[i] += v;
      }
      e.d[j * p.ldd + i] = v;
    }
  if (p.epilogue == LtEpilogue::BGradB)
    for (long j = 0; j < p.n; ++j)
      for (long k = 0; k < p.k; ++k) e.bias[j] += B(k, j);
  return e;
}

std::vector<float> random_matrix(long n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// A small layer: X [M, K], W [N, K], b [N], dY [M, N], in fp32 (the plan is the same for
// 16 bits, but for the types).
constexpr long kM = 6, kN = 16, kK = 8;

EpilogueRequest small(LinearProduct what) {
  EpilogueRequest r;
  r.product = what;
  r.M = kM, r.N = kN, r.K = kK;
  r.out_addr = kBase, r.bias_addr = kBase + 4096, r.aux_addr = kBase + 8192;
  return r;
}

TEST(ChooseEpilogue, ForwardPlansComputeTheRowMajorLayer) {
  const auto X = random_matrix(kM * kK, 1), W = random_matrix(kN * kK, 2), b = random_matrix(kN, 3);
  const auto R = random_matrix(kM * kN, 4);
  EpilogueRequest r = small(LinearProduct::Forward);
  r.bias = r.residual = true;
  const EpiloguePlan p = choose_epilogue(r);
  ASSERT_FALSE(p.fallback) << p.reason;
  const Emulated e = lt_emulate(p, W.data(), X.data(), R, b.data(), nullptr, 0);  // A = W, B = X (a_is_weight)
  EpilogueRequest g = small(LinearProduct::ForwardGelu);
  g.bias = true, g.aux_ld = kN;
  const EpiloguePlan pg = choose_epilogue(g);
  ASSERT_FALSE(pg.fallback) << pg.reason;
  const Emulated eg = lt_emulate(pg, W.data(), X.data(), {}, b.data(), nullptr, kM * kN);
  for (long m = 0; m < kM; ++m)
    for (long n = 0; n < kN; ++n) {
      double y = b[n];
      for (long k = 0; k < kK; ++k) y += static_cast<double>(X[m * kK + k]) * W[n * kK + k];
      // Row-major Y[m, n] is column-major D[n, m] at n + m * ldd.
      EXPECT_NEAR(e.d[m * p.ldd + n], y + R[m * kN + n], 1e-5) << m << ", " << n;
      EXPECT_NEAR(eg.aux[m * pg.aux_ld + n], y, 1e-5) << m << ", " << n;
      EXPECT_NEAR(eg.d[m * pg.ldd + n], gelu_ref(static_cast<float>(y)), 1e-5) << m << ", " << n;
    }
}

TEST(ChooseEpilogue, BackwardPlansComputeTheRowMajorGradients) {
  const auto X = random_matrix(kM * kK, 5), W = random_matrix(kN * kK, 6), dY = random_matrix(kM * kN, 7);
  const auto pre = random_matrix(kM * kK, 8);  // the previous layer's pre-activation [M, K]
  // dW [N, K] = dY^T X, db = column sums of dY: A = X, B = dY.
  EpilogueRequest w = small(LinearProduct::WeightGrad);
  w.bias = true;
  const EpiloguePlan pw = choose_epilogue(w);
  ASSERT_FALSE(pw.fallback) << pw.reason;
  const Emulated ew = lt_emulate(pw, X.data(), dY.data(), {}, nullptr, nullptr, 0);
  // dX [M, K] = (dY W) * gelu'(pre), db_prev = its column sums: A = W, B = dY.
  EpilogueRequest x = small(LinearProduct::DataGradDGelu);
  x.aux_ld = kK;
  const EpiloguePlan px = choose_epilogue(x);
  ASSERT_FALSE(px.fallback) << px.reason;
  const Emulated ex = lt_emulate(px, W.data(), dY.data(), {}, nullptr, pre.data(), kM * kK);
  for (long n = 0; n < kN; ++n) {
    double db = 0;
    for (long m = 0; m < kM; ++m) db += dY[m * kN + n];
    EXPECT_NEAR(ew.bias[n], db, 1e-5) << n;
    for (long k = 0; k < kK; ++k) {
      double dw = 0;
      for (long m = 0; m < kM; ++m) dw += static_cast<double>(dY[m * kN + n]) * X[m * kK + k];
      EXPECT_NEAR(ew.d[n * pw.ldd + k], dw, 1e-5) << n << ", " << k;  // row-major dW[n, k]
    }
  }
  for (long k = 0; k < kK; ++k) {
    double db_prev = 0;
    for (long m = 0; m < kM; ++m) {
      double dx = 0;
      for (long n = 0; n < kN; ++n) dx += static_cast<double>(dY[m * kN + n]) * W[n * kK + k];
      dx *= gelu_grad_ref(pre[m * kK + k]);
      db_prev += dx;
      EXPECT_NEAR(ex.d[m * px.ldd + k], dx, 1e-5) << m << ", " << k;  // row-major dX[m, k]
    }
    EXPECT_NEAR(ex.bias[k], db_prev, 1e-5) << k;
  }
}

TEST(ChooseEpilogue, ATileOfTheWeightGradientReadsItsColumnsOfDy) {
  // Rows [r0, r0 + 4) of W: dY's columns from r0, at dY's full pitch kN.
  const auto X = random_matrix(kM * kK, 9), dY = random_matrix(kM * kN, 10);
  const long r0 = 8, rows = 4;
  EpilogueRequest w = small(LinearProduct::WeightGrad);
  w.N = rows, w.ldy = kN, w.tiles = 4, w.bias = true;
  const EpiloguePlan p = choose_epilogue(w);
  ASSERT_FALSE(p.fallback) << p.reason;
  const Emulated e = lt_emulate(p, X.data(), dY.data() + r0, {}, nullptr, nullptr, 0);
  for (long n = 0; n < rows; ++n) {
    double db = 0;
    for (long m = 0; m < kM; ++m) db += dY[m * kN + r0 + n];
    EXPECT_NEAR(e.bias[n], db, 1e-5);
    for (long k = 0; k < kK; ++k) {
      double dw = 0;
      for (long m = 0; m < kM; ++m) dw += static_cast<double>(dY[m * kN + r0 + n]) * X[m * kK + k];
      EXPECT_NEAR(e.d[n * p.ldd + k], dw, 1e-5);
    }
  }
}

TEST(PlanNorm, OneWarpPerRowVectorisedWhereColumnsAllow) {
  const NormPlan p = plan_norm(8192, 2048, 132, true);
  EXPECT_EQ(p.vec, 4);
  EXPECT_EQ(p.blocks, 8192 / p.rows_per_block);
  EXPECT_EQ(p.col_blocks, 8);
  EXPECT_EQ(plan_norm(10, 50, 132, false).vec, 1);
  EXPECT_EQ(plan_norm(10, 50, 132, false).blocks, 3);
}

TEST(PlanNorm, GradientChunksCoverEveryRowOnceAndFillTheGpu) {
  for (long rows : {1L, 31L, 32L, 33L, 1000L, 2048L, 8192L, 65536L}) {
    for (int n : {50, 768, 2048, 8192}) {
      for (int sms : {1, 132, 1000}) {
        const NormPlan p = plan_norm(rows, n, sms, true);
        SCOPED_TRACE(::testing::Message() << rows << " rows, n " << n << ", " << sms << " SMs");
        ASSERT_GE(p.partial_blocks, 1);
        // Every row in exactly one chunk: the chunks reach the last row, none is empty.
        EXPECT_GE(p.partial_blocks * p.rows_per_partial, rows);
        EXPECT_LT((p.partial_blocks - 1) * p.rows_per_partial, rows);
        if (rows >= kNormMinRowsPerPartial) {
          EXPECT_GE(p.rows_per_partial, kNormMinRowsPerPartial);
        }
        EXPECT_EQ(p.partial_bytes, static_cast<uint64_t>(p.partial_blocks) * n * 4 * 2);
        EXPECT_EQ(plan_norm(rows, n, sms, false).partial_bytes, p.partial_bytes / 2);
        EXPECT_LE(p.partial_bytes, norm_partial_bytes_max(rows, n));
        EXPECT_LE(p.partial_bytes, norm_partial_bytes_max(65536, n));
      }
    }
  }
  // The 1.1B's norms at 2 x 1024 tokens on an H200: enough blocks for every SM.
  const NormPlan big = plan_norm(2048, 2048, 132, true);
  EXPECT_GE(big.col_blocks * big.partial_blocks, 132);
}

// The fused path's partial buffer holds every plan it is used with: the norms' (with and
// without a bias) and the bias gradients' column sums (plan_norm without a bias) at each
// width given, for any rows up to the most and any GPU; and no more than the widest needs.
TEST(PlanNorm, OnePartialBufferServesTheNormsAndTheBiasGradients) {
  const long most = 8192;
  for (auto [d, wide] : {std::pair{768, 3072}, std::pair{2048, 8192}, std::pair{50, 50}}) {
    const std::vector<int> widths{d, 3 * d, wide};
    uint64_t widest = 0;
    for (int n : widths) widest = std::max(widest, norm_partial_bytes_max(most, n));
    const uint64_t bytes = partial_bytes_max(most, {d, 3 * d, wide});
    EXPECT_EQ(bytes, widest);
    for (long rows : {1L, 33L, 1024L, 2048L, 8192L})
      for (int n : widths)
        for (int sms : {1, 78, 132, 1000}) {
          SCOPED_TRACE(::testing::Message() << rows << " rows, n " << n << ", " << sms << " SMs");
          EXPECT_LE(plan_norm(rows, n, sms, true).partial_bytes, bytes);
          EXPECT_LE(plan_norm(rows, n, sms, false).partial_bytes, bytes);
        }
  }
  // The 1.1B's bias gradients at 2 x 1024 rows (the attention and MLP projections, whose
  // BGRADB cuBLASLt refused on an H200): a grid of at least one block per SM of an H100.
  const NormPlan bias = plan_norm(2048, 2048, 132, false);
  EXPECT_GE(bias.col_blocks * bias.partial_blocks, 132);
  EXPECT_EQ(bias.partial_bytes, static_cast<uint64_t>(bias.partial_blocks) * 2048 * 4);
}

TEST(CudaKernels, NamesAsTheConfigSpellsThem) {
  EXPECT_STREQ(to_string(CudaKernels::Reference), "reference");
  EXPECT_STREQ(to_string(CudaKernels::Fused), "fused");
  EXPECT_STREQ(to_string(LtEpilogue::GeluAuxBias), "gelu_aux_bias");
}

// "fused" names kernels of the cuda backend: the cpu model refuses it, naming the fix,
// rather than running its own kernels as if the choice had been honoured.
TEST(CudaKernels, FusedIsRefusedOnTheCpuBackend) {
  const GptShape shape{.layers = 1, .d_model = 32, .heads = 2, .seq_len = 16, .vocab = 50};
  GptOptions o;
  o.cuda_kernels = CudaKernels::Fused;
  try {
    make_gpt(Backend::Cpu, shape, o);
    ADD_FAILURE() << "make_gpt accepted fused kernels on the cpu backend";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set strata.backend to \"cuda\", or remove strata.cuda_kernels"),
              std::string::npos)
        << e.what();
  }
  o.cuda_kernels = CudaKernels::Reference;
  EXPECT_NE(make_gpt(Backend::Cpu, shape, o), nullptr);
}

}  // namespace
}  // namespace strata
