// What the cuda GPT's fused kernels (strata.cuda_kernels = "fused") decide on the host,
// as pure functions of shapes, types and alignments: which cuBLASLt epilogue a linear
// layer's matmul runs with (or why it falls back to cuBLAS and the reference kernels),
// and how a norm's rows and its gains' gradient are split over blocks. No CUDA here: the
// header compiles everywhere and tests/model/test_cuda_kernel_plan.cpp checks every
// decision on the CPU, since CI has no GPU to run the kernels on.
//
// Matrices are row-major as the model holds them; cuBLASLt is column-major, so every
// product is computed transposed (C^T = B^T A^T): a row-major [rows, cols] matrix is a
// column-major [cols, rows] one with the same leading dimension. The plan says the
// column-major operand order and transposes, so the launcher (gemm_lt_cuda.cpp) only
// copies them into cuBLASLt's descriptors.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/core/dtype.hpp"

namespace strata {

// Which kernels the cuda GPT runs (strata.cuda_kernels). The cpu model has one set and
// refuses Fused (make_gpt, and the config's check), so asking for it is never ignored.
enum class CudaKernels {
  // cuBLAS matmuls, then bias, GELU, column-sum and norm kernels: checked against the
  // cpu model on an H100 and an H200.
  Reference,
  // cuBLASLt matmuls with bias, GELU, residual and bias-gradient work in their epilogues
  // where choose_epilogue allows, and row-parallel norm kernels with a blocked reduction
  // for the gains' gradients. Compiled, NOT yet run on a GPU (docs/training.md).
  Fused,
};
const char* to_string(CudaKernels k);  // "reference", "fused"

// The products of a linear layer Y[M,N] = X[M,K] W[N,K]^T + b that the fused path runs.
enum class LinearProduct {
  Forward,         // Y = X W^T (+ b) (+ residual R, beta 1)
  ForwardGelu,     // Y = gelu(X W^T + b), the pre-activation kept in aux for backward
  WeightGrad,      // dW[N,K] = dY^T X, with db = column sums of dY when asked
  DataGrad,        // dX[M,K] = dY W (beta 0 or 1: tiles sum)
  DataGradDGelu,   // dX = (dY W) * gelu'(aux), and db of the layer before = its column sums
};

// cuBLASLt's epilogues the plan uses (the launcher maps them to CUBLASLT_EPILOGUE_*).
enum class LtEpilogue { Default, Bias, GeluAuxBias, DGeluBGrad, BGradB };
const char* to_string(LtEpilogue e);

struct EpilogueRequest {
  LinearProduct product = LinearProduct::Forward;
  long M = 0, N = 0, K = 0;      // the row-major product's sizes, as in LinearProduct
  long ldy = 0;                  // WeightGrad, DataGrad*: dY's row pitch (0: N; a tile's is the full N)
  bool accumulate = false;       // DataGrad: add to dX (a tile after the first)
  DType ab = DType::F32;         // the operands' type (the model's precision)
  DType out = DType::F32;        // the output's type: F32, or ab
  bool bias = false;             // Forward: add b; WeightGrad: also write db
  bool residual = false;         // Forward: add R (C = R, beta 1; fp32 out only)
  int tiles = 1;                 // row spans of W this product is one of (gpt_parts' tiles)
  bool whole_group = true;       // the block's weights and gradient are one part each
  // The addresses involved, as integers (only their alignment is read): the output, the
  // bias (or db), the aux; 0 where absent.
  uint64_t out_addr = 0, bias_addr = 0, aux_addr = 0;
  long aux_ld = 0;               // elements between rows of aux (ForwardGelu, DataGradDGelu)
};

// cuBLASLt's column-major view: D[m, n] = op(A)[m, k] op(B)[k, n], A and B as named
// (A_is_W: A is the weight, else the activation / gradient).
struct EpiloguePlan {
  bool fallback = false;         // run the reference path (cuBLAS, then the kernels)
  std::string reason;            // why, when fallback
  LtEpilogue epilogue = LtEpilogue::Default;
  long m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool a_is_weight = false;      // A is W (else X, or dY for WeightGrad)
  long lda = 0, ldb = 0, ldd = 0;
  long aux_ld = 0;               // elements, a multiple of kLtAuxLdMultiple
  DType aux_type = DType::F32;   // cuBLASLt keeps aux in D's type
  float beta = 0.0f;             // 1 with a residual (C = R)
};

// cuBLASLt's documented requirements the plan checks: the aux leading dimension is a
// multiple of 8, and the aux and bias vectors are 16-byte aligned (the output too, so
// the vectorised epilogue kernels apply).
inline constexpr long kLtAuxLdMultiple = 8;
inline constexpr uint64_t kLtAlignBytes = 16;

// The epilogue for one product, or fallback with the reason. Never throws: the caller
// runs the reference path on fallback, and on a heuristic that finds no algorithm.
EpiloguePlan choose_epilogue(const EpilogueRequest& r);

// How the fused norm kernels (LayerNorm, RMSNorm) cover rows of n columns. Forward and
// dx: one warp per row, rows_per_block warps in a block, `vec` elements per load. The
// gains' (and bias') gradient: a grid of col_blocks x partial_blocks blocks, each summing
// rows_per_partial rows of col_tile columns (a thread per column, coalesced) into its
// own row of a [partial_blocks, n] fp32 buffer (two with a bias); one more kernel sums
// the partial rows of each column and stores the result once, rounded to the model's type.
struct NormPlan {
  int vec = 1;                 // elements per load: 4 when n % 4 == 0 (float4), else 1
  int rows_per_block = 4;      // warps per block, one row each
  long blocks = 0;             // forward and dx grid: ceil(rows / rows_per_block)
  int col_tile = 256;          // columns per gradient block (its threads)
  long col_blocks = 0;         // ceil(n / col_tile)
  long partial_blocks = 0;     // row chunks of the gradient, each a partial row
  long rows_per_partial = 0;   // rows each chunk sums (at least kNormMinRowsPerPartial, or all)
  uint64_t partial_bytes = 0;  // bytes of the partial sums: partial_blocks x n fp32, x2 with a bias
};
inline constexpr long kNormMinRowsPerPartial = 32;

// rows, n > 0; sms > 0: the GPU's multiprocessors (the gradient grid is about 4 blocks
// per SM, fewer where the rows are too few); with_bias: LayerNorm (gain and bias), else
// RMSNorm (gain only).
NormPlan plan_norm(long rows, int n, int sms, bool with_bias);

// At least plan_norm(rows, n, sms, with_bias).partial_bytes for every rows <= max_rows,
// sms and with_bias: the buffer is carved once, before the GPU is asked (activation_bytes).
uint64_t norm_partial_bytes_max(long max_rows, int n);

// The fused path's one partial buffer, shared by the norms' gain gradients and the bias
// gradients cuBLASLt's epilogue does not take (column_sums_rows, laid out by plan_norm
// without a bias): the largest norm_partial_bytes_max over the widths given (every
// width a norm or a bias gradient has), so at least any plan's partial_bytes for them.
uint64_t partial_bytes_max(long max_rows, std::initializer_list<int> widths);

}  // namespace strata
