// The tensor-core causal attention (AttentionKernels::Mma, STRATA_ATTENTION=mma): the
// kernels of strata/model/attention_mma_kernels.hpp (FlashAttention-2 on mma.sync, the
// scores in registers; that header says how they work) instantiated with CudaThread, one
// PTX instruction a call, and their launchers. This version (2026-11-28) replaces the
// WMMA one that ran correct but 21% slower than the gemm path on an H100: that one stored
// every tile's scores to shared memory as fp32 between the two products and took two
// passes over the keys in forward. Checked on the CPU by an emulation of the block
// (tests/model/test_attention_mma_emulated.cpp); NOT yet run on a GPU (scripts/gpu-check.sh
// attn runs its tests against the cpu model, the sanitizers and the 1.1B step).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attention_mma_cuda.hpp"
#include "kernels_cuda.hpp"
#include "storage_cuda.cuh"

#include "strata/model/attention_mma_kernels.hpp"
#include "strata/model/attention_mma_plan.hpp"

// mma.sync with bf16, ldmatrix and cp.async need sm_80: a build for older GPUs compiles
// the kernels to a trap, and the launchers refuse such a GPU before launching
// (attention_mma_gpu_refusal).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define STRATA_MMA_ARCH 1
#else
#define STRATA_MMA_ARCH 0
#endif

namespace strata::detail::cuda {

namespace {

using mma_attention::kThreads;

#if STRATA_MMA_ARCH

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The Gpu interface of attention_mma_kernels.hpp on a GPU, for 16-bit storage S (Bf16S or
// Fp16S): each call one instruction (or two).
template <class S>
struct CudaThread {
  unsigned char* smem;

  __device__ __forceinline__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int block_x() const { return static_cast<int>(blockIdx.x); }
  __device__ __forceinline__ int block_y() const { return static_cast<int>(blockIdx.y); }
  __device__ __forceinline__ int blocks_x() const { return static_cast<int>(gridDim.x); }
  __device__ __forceinline__ unsigned char* shared() const { return smem; }

  __device__ __forceinline__ void ldmatrix(uint32_t (&r)[4], const uint16_t* row, bool trans) {
    if (trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(smem_addr(row)));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(smem_addr(row)));
  }

  __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<S, Bf16S>) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }

  __device__ __forceinline__ uint32_t pack(float lo, float hi) const {
    uint32_t bits;
    if constexpr (std::is_same_v<S, Bf16S>) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      memcpy(&bits, &v, 4);
    } else {
      const __half2 v = __floats2half2_rn(lo, hi);
      memcpy(&bits, &v, 4);
    }
    return bits;
  }

  __device__ __forceinline__ float ex2(float x) const {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  }
  __device__ __forceinline__ float shfl_xor(float v, int mask) const { return __shfl_xor_sync(0xffffffffu, v, mask); }
  __device__ __forceinline__ void sync() const { __syncthreads(); }

  __device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) const {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
  }
  __device__ __forceinline__ void copy4(void* dst, const void* src, bool valid) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
  }
  __device__ __forceinline__ void commit() const { asm volatile("cp.async.commit_group;\n" ::); }
  __device__ __forceinline__ void wait_all_but_newest() const { asm volatile("cp.async.wait_group 1;\n" ::); }
  __device__ __forceinline__ void wait_all() const { asm volatile("cp.async.wait_group 0;\n" ::); }
};

#endif  // STRATA_MMA_ARCH

// Each kernel: grid and arguments as its body in attention_mma_kernels.hpp. Register
// budget: 2 blocks of 128 threads an SM (255 registers a thread at most): ptxas spilled a
// few bytes in three of the shapes without the 2, none with it (sm_90, CUDA 13.0).
template <int BC, int NP, class S>
__global__ void __launch_bounds__(kThreads, 2)
    attention_mma_forward_kernel(const uint16_t* qkv, uint16_t* out, float* lse, int T, int d, int H, float scale,
                                 AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  CudaThread<S> g{smem};
  mma_attention::forward<BC, NP>(g, qkv, out, lse, T, d, H, scale, lay);
#else
  __trap();
#endif
}

template <int BC, int NP, class S>
__global__ void __launch_bounds__(kThreads, 2)
    attention_mma_dq_kernel(const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                            float* dqkv, int T, int d, int H, float scale, AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  CudaThread<S> g{smem};
  mma_attention::dq<BC, NP>(g, qkv, lse, dout, dotp, dqkv, T, d, H, scale, lay);
#else
  __trap();
#endif
}

template <int BC, int NP, class S>
__global__ void __launch_bounds__(kThreads, 2)
    attention_mma_dkv_kernel(const uint16_t* qkv, const float* lse, const uint16_t* dout, const float* dotp,
                             float* dqkv, int T, int d, int H, float scale, AttentionMmaLayout lay) {
#if STRATA_MMA_ARCH
  extern __shared__ __align__(128) unsigned char smem[];
  CudaThread<S> g{smem};
  mma_attention::dkv<BC, NP>(g, qkv, lse, dout, dotp, dqkv, T, d, H, scale, lay);
#else
  __trap();
#endif
}

// The kernels' compile-time shape: inner tile BC and 16-column steps NP (hd <= 16 NP).
template <int BC_, int NP_, class S_>
struct Shape {
  static constexpr int BC = BC_, NP = NP_;
  using S = S_;
};

// Calls f(Shape<...>{}) for type t (BF16 or F16), inner tile bc (64 or 32) and head
// dimension hd.
template <class F>
void with_shape(DType t, int bc, int hd, F&& f) {
  const auto by_tile = [&](auto tag) {
    using S = decltype(tag);
    if (bc == 64) {
      if (hd <= 64) f(Shape<64, 4, S>{});
      else f(Shape<64, 8, S>{});
    } else {
      if (hd <= 64) f(Shape<32, 4, S>{});
      else f(Shape<32, 8, S>{});
    }
  };
  if (t == DType::BF16) by_tile(Bf16S{});
  else by_tile(Fp16S{});
}

int compute_capability_major() {
  int dev = 0, major = 0;
  STRATA_CHECK_CUDA(cudaGetDevice(&dev));
  STRATA_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
}

// After the checks (ConfigError naming the fix), this GPU's per-block shared memory.
uint64_t checked_shared(const void* a, const void* b, DType t, int hd) {
  std::string why = attention_mma_refusal(hd, t);
  if (why.empty()) why = attention_mma_gpu_refusal(hd);
  if (!why.empty()) throw ConfigError(why);
  // 16-byte copies of rows that start hd (a multiple of 16) elements apart.
  STRATA_CHECK(reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0,
               "the mma attention's 16-bit operands must be 16-byte aligned");
  return static_cast<uint64_t>(max_shared_bytes());
}

AttentionMmaLayout layout_for(AttentionMmaKernel kernel, int hd, uint64_t shared) {
  return attention_mma_layout(kernel, attention_mma_inner(kernel, hd, shared), hd);
}

template <class Kernel, class... Args>
void launch(Kernel kernel, const AttentionMmaLayout& lay, int T, int BH, cudaStream_t s, Args... args) {
  allow_shared(kernel, lay.bytes);
  const dim3 grid((T + kMmaBlockRows - 1) / kMmaBlockRows, static_cast<unsigned>(BH));
  kernel<<<grid, kThreads, lay.bytes, s>>>(args..., lay);
  STRATA_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

std::string attention_mma_gpu_refusal(int head_dim) {
  if (compute_capability_major() < 8)
    return "STRATA_ATTENTION=mma needs a GPU of compute capability 8.0 (Ampere) or newer for bf16 tensor cores; "
           "set STRATA_ATTENTION=gemm (the default)";
  const int limit = max_shared_bytes();
  for (AttentionMmaKernel k : {AttentionMmaKernel::Forward, AttentionMmaKernel::Dq, AttentionMmaKernel::Dkv})
    if (attention_mma_inner(k, head_dim, static_cast<uint64_t>(limit)) == 0)
      return "STRATA_ATTENTION=mma at head dimension " + std::to_string(head_dim) + " needs " +
             std::to_string(attention_mma_least_bytes(head_dim)) +
             " bytes of shared memory per block, more than this GPU's " + std::to_string(limit) +
             "; set STRATA_ATTENTION=gemm (the default), or use more heads";
  return "";
}

void attention_mma_forward(const void* qkv, void* out, DType t, float* lse, int B, int T, int d, int H,
                           cudaStream_t s) {
  const int hd = d / H;
  const AttentionMmaLayout lay = layout_for(AttentionMmaKernel::Forward, hd, checked_shared(qkv, out, t, hd));
  const float scale = 1.0f / sqrtf(static_cast<float>(lay.head_dim));
  with_shape(t, lay.inner, lay.head_dim, [&](auto shape) {
    using Sh = decltype(shape);
    launch(attention_mma_forward_kernel<Sh::BC, Sh::NP, typename Sh::S>, lay, T, B * H, s,
           static_cast<const uint16_t*>(qkv), static_cast<uint16_t*>(out), lse, T, d, H, scale);
  });
}

void attention_mma_backward(const void* qkv, DType t, const float* lse, const void* dout, float* dqkv,
                            const float* dotp, int B, int T, int d, int H, cudaStream_t s) {
  const int hd = d / H;
  const uint64_t shared = checked_shared(qkv, dout, t, hd);
  const AttentionMmaLayout dq = layout_for(AttentionMmaKernel::Dq, hd, shared);
  const AttentionMmaLayout dkv = layout_for(AttentionMmaKernel::Dkv, hd, shared);
  const float scale = 1.0f / sqrtf(static_cast<float>(dq.head_dim));
  const auto* q = static_cast<const uint16_t*>(qkv);
  const auto* g = static_cast<const uint16_t*>(dout);
  with_shape(t, dq.inner, dq.head_dim, [&](auto shape) {
    using Sh = decltype(shape);
    launch(attention_mma_dq_kernel<Sh::BC, Sh::NP, typename Sh::S>, dq, T, B * H, s, q, lse, g, dotp, dqkv, T, d, H,
           scale);
  });
  with_shape(t, dkv.inner, dkv.head_dim, [&](auto shape) {
    using Sh = decltype(shape);
    launch(attention_mma_dkv_kernel<Sh::BC, Sh::NP, typename Sh::S>, dkv, T, B * H, s, q, lse, g, dotp, dqkv, T, d, H,
           scale);
  });
}

}  // namespace strata::detail::cuda
