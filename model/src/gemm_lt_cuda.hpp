// The fused path's matmuls (strata.cuda_kernels = "fused"): one cuBLASLt product with the
// epilogue cuda_kernel_plan.hpp's choose_epilogue planned. A product cuBLASLt has no
// algorithm for, or refuses at launch, comes back false and the caller runs the reference
// path (cuBLAS, then the kernels) instead, so an unsupported combination costs speed,
// never a wrong result. Compiled in CI, NOT yet run on a GPU (docs/training.md).
//
// Host C++20, included by gpt_cuda.cpp only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "strata/core/dtype.hpp"
#include "strata/model/cuda_kernel_plan.hpp"

namespace strata::detail::cuda {

// What one launch reads and writes; device pointers, types as the plan's request said.
struct LtProduct {
  const void* a = nullptr;     // the plan's A (W when plan.a_is_weight)
  const void* b = nullptr;     // the plan's B
  const void* c = nullptr;     // added with beta 1 (the residual); null: D itself
  void* d = nullptr;           // the output
  void* bias = nullptr;        // bias (read) or bias gradient (written); null when none
  void* aux = nullptr;         // GELU's pre-activation (written forward, read backward)
  DType ab = DType::F32;       // A's and B's type
  DType out = DType::F32;      // C's and D's type (and aux's, and a bias gradient's)
  DType bias_type = DType::F32;  // a bias's type (the weights'); a gradient's is `out`
};

class LtMatmul {
 public:
  // workspace: device memory of `workspace_bytes`, used on `stream` only.
  LtMatmul(cudaStream_t stream, void* workspace, uint64_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Queues plan's product on the stream. False (nothing queued) when cuBLASLt has no
  // algorithm for it or refuses it; the answer is remembered per shape, types and
  // alignment, so the heuristic runs once per distinct product.
  bool run(const EpiloguePlan& plan, const LtProduct& p);
  // The plan for `what` said fallback: logged once per product and reason (info), so a
  // run shows which products took the reference path and why.
  void note_fallback(LinearProduct what, const std::string& why);

 private:
  using Key = std::tuple<long, long, long, long, long, long, int, int, int, int, int, int, long, int, int>;
  struct Known {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  uint64_t workspace_bytes_;
  std::map<Key, Known> known_;
  std::set<std::string> noted_;  // fallbacks already logged
};

}  // namespace strata::detail::cuda
