// cuda_kernel_plan.hpp's decisions: plain host code, compiled with or without CUDA.
#include "strata/model/cuda_kernel_plan.hpp"

#include <algorithm>

namespace strata {

const char* to_string(CudaKernels k) { return k == CudaKernels::Fused ? "fused" : "reference"; }

const char* to_string(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::Default: return "default";
    case LtEpilogue::Bias: return "bias";
    case LtEpilogue::GeluAuxBias: return "gelu_aux_bias";
    case LtEpilogue::DGeluBGrad: return "dgelu_bgrad";
    case LtEpilogue::BGradB: return "bgradb";
  }
  return "?";
}

namespace {

EpiloguePlan fall_back(std::string why) {
  EpiloguePlan p;
  p.fallback = true;
  p.reason = std::move(why);
  return p;
}

bool aligned(uint64_t addr) { return addr % kLtAlignBytes == 0; }

// The checks every epilogue with an aux matrix shares; "" when they pass.
std::string aux_problem(const EpilogueRequest& r, long aux_rows) {
  if (r.out != r.ab) return "cuBLASLt keeps aux in the output's type, and the output is not the operands' type";
  if (r.aux_ld < aux_rows) return "aux's leading dimension is smaller than its rows";
  if (r.aux_ld % kLtAuxLdMultiple != 0) return "aux's leading dimension is not a multiple of 8";
  if (r.aux_addr == 0 || !aligned(r.aux_addr)) return "aux is not 16-byte aligned";
  return "";
}

}  // namespace

// Column-major views (header): Y^T[N, M] = W[N,K] (col-major K x N, transposed) times
// X^T (col-major K x M); dW^T[K, N] = X^T (K x M) times dY (col-major N x M, transposed);
// dX^T[K, M] = W^T (col-major K x N) times dY^T (col-major N x M).
EpiloguePlan choose_epilogue(const EpilogueRequest& r) {
  if (r.M <= 0 || r.N <= 0 || r.K <= 0) return fall_back("an empty product");
  if (r.ab != DType::F32 && r.ab != DType::BF16 && r.ab != DType::F16)
    return fall_back("cuBLASLt's path takes f32, bf16 or fp16 operands");
  if (r.out != DType::F32 && r.out != r.ab) return fall_back("the output is neither fp32 nor the operands' type");
  if (r.out_addr == 0 || !aligned(r.out_addr)) return fall_back("the output is not 16-byte aligned");
  const long ldy = r.ldy > 0 ? r.ldy : r.N;
  if (ldy < r.N) return fall_back("dY's row pitch is smaller than its columns");
  EpiloguePlan p;
  p.aux_type = r.out;
  switch (r.product) {
    case LinearProduct::Forward:
    case LinearProduct::ForwardGelu: {
      p.m = r.N, p.n = r.M, p.k = r.K;
      p.trans_a = true, p.a_is_weight = true;
      p.lda = r.K, p.ldb = r.K, p.ldd = r.N;
      if (r.residual) {
        if (r.out != DType::F32) return fall_back("the residual stream is fp32: a residual needs an fp32 output");
        if (r.product == LinearProduct::ForwardGelu) return fall_back("GELU's output takes no residual");
        p.beta = 1.0f;
      }
      if (r.bias && (r.bias_addr == 0 || !aligned(r.bias_addr))) return fall_back("the bias is not 16-byte aligned");
      if (r.product == LinearProduct::Forward) {
        p.epilogue = r.bias ? LtEpilogue::Bias : LtEpilogue::Default;
        return p;
      }
      if (!r.bias) return fall_back("GELU_AUX_BIAS needs a bias");
      if (std::string why = aux_problem(r, r.N); !why.empty()) return fall_back(why);
      p.epilogue = LtEpilogue::GeluAuxBias;
      p.aux_ld = r.aux_ld;
      return p;
    }
    case LinearProduct::WeightGrad:
      p.m = r.K, p.n = r.N, p.k = r.M;
      p.trans_b = true;
      p.lda = r.K, p.ldb = ldy, p.ldd = r.K;
      if (r.out != r.ab) return fall_back("a weight gradient is stored in the weights' type");
      if (!r.bias) return p;
      if (!r.whole_group)
        return fall_back("the group is in parts: the bias gradient is handed back before the weight's tiles");
      if (r.bias_addr == 0 || !aligned(r.bias_addr)) return fall_back("the bias gradient is not 16-byte aligned");
      p.epilogue = LtEpilogue::BGradB;
      return p;
    case LinearProduct::DataGrad:
    case LinearProduct::DataGradDGelu:
      p.m = r.K, p.n = r.M, p.k = r.N;
      p.a_is_weight = true;
      p.lda = r.K, p.ldb = ldy, p.ldd = r.K;
      if (r.product == LinearProduct::DataGrad) {
        p.beta = r.accumulate ? 1.0f : 0.0f;
        return p;
      }
      if (r.tiles != 1 || r.accumulate) return fall_back("dX is summed over tiles: GELU's derivative needs the sum");
      if (!r.whole_group) return fall_back("the group is in parts: the bias gradient would be written out of order");
      if (r.bias_addr == 0 || !aligned(r.bias_addr)) return fall_back("the bias gradient is not 16-byte aligned");
      if (std::string why = aux_problem(r, r.K); !why.empty()) return fall_back(why);
      p.epilogue = LtEpilogue::DGeluBGrad;
      p.aux_ld = r.aux_ld;
      return p;
  }
  return fall_back("an unknown product");
}

namespace {

constexpr int kMaxSms = 256;  // the partial buffer is sized for this many multiprocessors

// Row chunks of the gains' gradient: about 4 blocks per SM in all, each over at least
// kNormMinRowsPerPartial rows.
long norm_chunks(long rows, long col_blocks, int sms) {
  const long want = std::max<long>(1, (4L * std::clamp(sms, 1, kMaxSms) + col_blocks - 1) / col_blocks);
  const long most = std::max<long>(1, rows / kNormMinRowsPerPartial);
  return std::min(want, most);
}

}  // namespace

NormPlan plan_norm(long rows, int n, int sms, bool with_bias) {
  NormPlan p;
  p.vec = n % 4 == 0 ? 4 : 1;
  p.blocks = (rows + p.rows_per_block - 1) / p.rows_per_block;
  p.col_blocks = (n + p.col_tile - 1) / p.col_tile;
  const long chunks = norm_chunks(rows, p.col_blocks, sms);
  p.rows_per_partial = (rows + chunks - 1) / chunks;
  p.partial_blocks = (rows + p.rows_per_partial - 1) / p.rows_per_partial;  // <= chunks
  p.partial_bytes = static_cast<uint64_t>(p.partial_blocks) * static_cast<uint64_t>(n) * sizeof(float) *
                    (with_bias ? 2u : 1u);
  return p;
}

uint64_t norm_partial_bytes_max(long max_rows, int n) {
  // partial_blocks <= norm_chunks, which grows with rows and sms.
  const long col_blocks = (n + NormPlan{}.col_tile - 1) / NormPlan{}.col_tile;
  return static_cast<uint64_t>(norm_chunks(max_rows, col_blocks, kMaxSms)) * static_cast<uint64_t>(n) *
         sizeof(float) * 2u;
}

uint64_t partial_bytes_max(long max_rows, std::initializer_list<int> widths) {
  uint64_t most = 0;
  for (int n : widths) most = std::max(most, norm_partial_bytes_max(max_rows, n));
  return most;
}

}  // namespace strata
