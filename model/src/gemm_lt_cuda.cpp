// LtMatmul (gemm_lt_cuda.hpp): descriptors built per launch from the plan (cheap host
// calls), the heuristic's algorithm remembered per distinct product.
#include "gemm_lt_cuda.hpp"

#include <algorithm>
#include <string>

#include "kernels_cuda.hpp"
#include "strata/core/log.hpp"

namespace strata::detail::cuda {

namespace {

const char* product_name(LinearProduct p) {
  switch (p) {
    case LinearProduct::Forward: return "forward";
    case LinearProduct::ForwardGelu: return "forward with GELU";
    case LinearProduct::WeightGrad: return "weight gradient";
    case LinearProduct::DataGrad: return "data gradient";
    case LinearProduct::DataGradDGelu: return "data gradient with GELU's derivative";
  }
  return "?";
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::Default: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::DGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case LtEpilogue::BGradB: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment prefs).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// The descriptors of one launch, destroyed on scope exit. A failing create or set is
// reported as not supported: the caller falls back.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  bool ok = true;
  ~Descs() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto* l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    ok = ok && cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof(v)) == CUBLAS_STATUS_SUCCESS;
  }
  void layout(cublasLtMatrixLayout_t* l, DType t, long rows, long cols, long ld) {
    ok = ok && cublasLtMatrixLayoutCreate(l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                                          static_cast<int64_t>(ld)) == CUBLAS_STATUS_SUCCESS;
  }
};

bool build(Descs& ds, const EpiloguePlan& plan, const LtProduct& p) {
  ds.ok = cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const int32_t ta = plan.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = plan.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  ds.set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
  ds.set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
  const uint32_t epi = lt_epilogue(plan.epilogue);
  ds.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (plan.epilogue != LtEpilogue::Default) {
    const void* bias = p.bias;
    ds.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    // A bias is in the weights' type; a bias gradient in the output's (cuBLASLt's rule).
    const bool grad = plan.epilogue == LtEpilogue::DGeluBGrad || plan.epilogue == LtEpilogue::BGradB;
    const int32_t bt = cuda_type(grad ? p.out : p.bias_type);
    ds.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt);
  }
  if (plan.epilogue == LtEpilogue::GeluAuxBias || plan.epilogue == LtEpilogue::DGeluBGrad) {
    const void* aux = p.aux;
    const int64_t ld = plan.aux_ld;
    ds.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    ds.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
  }
  // Stored operands: op(A) is m x k, so A is k x m when transposed; likewise B.
  ds.layout(&ds.a, p.ab, plan.trans_a ? plan.k : plan.m, plan.trans_a ? plan.m : plan.k, plan.lda);
  ds.layout(&ds.b, p.ab, plan.trans_b ? plan.n : plan.k, plan.trans_b ? plan.k : plan.n, plan.ldb);
  ds.layout(&ds.c, p.out, plan.m, plan.n, plan.ldd);
  ds.layout(&ds.d, p.out, plan.m, plan.n, plan.ldd);
  return ds.ok;
}

}  // namespace

LtMatmul::LtMatmul(cudaStream_t stream, void* workspace, uint64_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  STRATA_CHECK_CUBLAS(cublasLtCreate(&lt_));
}

LtMatmul::~LtMatmul() {
  if (lt_) cublasLtDestroy(lt_);
}

void LtMatmul::note_fallback(LinearProduct what, const std::string& why) {
  std::string m = std::string("cuda fused kernels: a linear layer's ") + product_name(what) +
                  " runs the reference path (cuBLAS, then the kernels): " + why;
  if (noted_.insert(m).second) log::info(m);
}

bool LtMatmul::run(const EpiloguePlan& plan, const LtProduct& p) {
  if (plan.fallback) return false;
  const void* c = p.c ? p.c : p.d;
  const Key key{plan.m, plan.n, plan.k, plan.lda, plan.ldb, plan.ldd,
                static_cast<int>(plan.trans_a) | static_cast<int>(plan.trans_b) << 1 |
                    static_cast<int>(plan.beta != 0.0f) << 2,
                static_cast<int>(plan.epilogue), static_cast<int>(p.ab), static_cast<int>(p.out),
                static_cast<int>(alignment_of(p.a)), static_cast<int>(alignment_of(p.b)), plan.aux_ld,
                static_cast<int>(std::min({alignment_of(c), alignment_of(p.d)})),
                static_cast<int>(std::min(alignment_of(p.bias), alignment_of(p.aux)))};
  Descs ds;
  if (!build(ds, plan, p)) return false;
  auto it = known_.find(key);
  if (it == known_.end()) {
    Known k;
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      const uint64_t ws = workspace_bytes_;
      // As the reference's handle: no split-K partial sums reduced in a 16-bit output type.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_MASK & ~uint32_t{CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
      const uint32_t al_a = alignment_of(p.a), al_b = alignment_of(p.b), al_c = alignment_of(c),
                     al_d = alignment_of(p.d);
      bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                     sizeof(ws)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                      sizeof(schemes)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                      sizeof(al_a)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                      sizeof(al_b)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                      sizeof(al_c)) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                      sizeof(al_d)) == CUBLAS_STATUS_SUCCESS;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      if (ok && cublasLtMatmulAlgoGetHeuristic(lt_, ds.op, ds.a, ds.b, ds.c, ds.d, pref, 1, &result, &found) ==
                    CUBLAS_STATUS_SUCCESS &&
          found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
        k.ok = true;
        k.algo = result.algo;
      }
      cublasLtMatmulPreferenceDestroy(pref);
    }
    it = known_.emplace(key, k).first;
    if (!k.ok)
      log::info(std::string("cuda fused kernels: cuBLASLt has no algorithm for the ") + to_string(plan.epilogue) +
                " product " + std::to_string(plan.m) + " x " + std::to_string(plan.n) + " x " +
                std::to_string(plan.k) + " (" + to_string(p.ab) + " -> " + to_string(p.out) +
                "); the reference path runs it");
  }
  if (!it->second.ok) return false;
  const float alpha = 1.0f, beta = plan.beta;
  const cublasStatus_t rc = cublasLtMatmul(lt_, ds.op, &alpha, p.a, ds.a, p.b, ds.b, &beta, c, ds.c, p.d, ds.d,
                                           &it->second.algo, workspace_, workspace_bytes_, stream_);
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE) {
    it->second.ok = false;  // refused before anything was queued: the reference path from now on
    log::info(std::string("cuda fused kernels: cuBLASLt refused the ") + to_string(plan.epilogue) + " product (" +
              cublasGetStatusString(rc) + "); the reference path runs it");
    return false;
  }
  STRATA_CHECK_CUBLAS(rc);
  return true;
}

}  // namespace strata::detail::cuda
