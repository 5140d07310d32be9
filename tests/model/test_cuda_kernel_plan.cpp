// cuda_kernel_plan.hpp on the CPU: every decision the fused cuda kernels take on the host
// (which cuBLASLt epilogue, which operands, or fallback and why; the norm kernels' grids),
// checked where CI runs, since no GPU there runs the kernels themselves.
#include "strata/model/cuda_kernel_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

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
