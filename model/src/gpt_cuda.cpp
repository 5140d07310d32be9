// GptCuda: the cpu model (Gpt) on the cuda backend (see gpt_cuda.hpp). The host side lives in
// this C++20 file (it needs gpt_layout.hpp, which CUDA sources kept to C++17 cannot
// include); the kernels are in kernels_cuda.cu and attention_cuda.cu behind plain
// launchers. Every step mirrors Gpt::Impl (gpt_cpu.hpp), buffer for buffer.
//
// Precision (GptOptions::precision, docs/mixed-precision.md): in fp32 the matmuls are
// cuBLAS sgemm without TF32, as they always were. In bf16 and fp16 they are cublasGemmEx
// over 16-bit operands with fp32 accumulation on the tensor cores; the activations that
// feed a matmul are stored 16-bit, the residual stream, fc and every activation gradient
// fp32, and each gradient of an activation is rounded just before the matmuls that read it.
//
// Attention (attention_cuda.cu) runs on cuBLAS through this model's handle (its stream,
// its math mode: no TF32 in fp32), its [T, T] scores in scratch carved with the other
// buffers, so activation_bytes() counts it; STRATA_ATTENTION=flash or mma, read when the
// model is built (and by the static activation_bytes), selects the flash kernels or the
// tensor-core ones (16 bits only; NOT yet run on a GPU) instead, which need no scratch.
//
// Compiled and linked in CI, never run there (no GPU). fp32 was checked on an H100, and
// fp32, bf16 and fp16, GPT-2 and Llama (its blocks below mirror gpt_cpu_blocks.cpp's
// llama_block_forward / _backward) on an H200 (docs/training.md, docs/mixed-precision.md).
#include "strata/model/gpt_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "gemm_lt_cuda.hpp"
#include "kernels_cuda.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/model/gpt_driver.hpp"

namespace strata {

namespace cu = detail::cuda;

namespace {

constexpr uint64_t kLogitsChunkBytes = 32ull << 20;  // one chunk of [rows, vocab] fp32 logits, as gpt.cpp
// cuBLAS's workspace in 16 bits, from the model's own allocation (so activation_bytes
// counts it): the size cuBLAS's documentation recommends on Hopper (cublasSetWorkspace).
constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

// Hands out pieces of one device allocation; with no base it only counts (activation_bytes).
struct Arena {
  char* base = nullptr;
  uint64_t used = 0;  // bytes
  void* take_bytes(uint64_t bytes) {
    used = (used + 255) & ~uint64_t{255};
    void* p = base ? base + used : nullptr;
    used += bytes;
    return p;
  }
  template <class T>
  T* take(uint64_t n) {
    return static_cast<T*>(take_bytes(n * sizeof(T)));
  }
  void* take_as(DType t, uint64_t n) { return take_bytes(n * dtype_size(t)); }
};

using cu::cuda_type;

// Row-major C[M,N] = alpha op(A) op(B) + beta C through column-major cuBLAS: the same
// product transposed, C^T = op(B)^T op(A)^T, so the operands swap and the flags stay.
void gemm(cublasHandle_t h, bool ta, bool tb, long M, long N, long K, float alpha, const float* A, long lda,
          const float* B, long ldb, float beta, float* C, long ldc) {
  STRATA_CHECK_CUBLAS(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                  static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C, static_cast<int>(ldc)));
}

// The same over 16-bit A and B (type ab): fp32 accumulation (CUBLAS_COMPUTE_32F, tensor
// cores), C of type ct: F32, or ab, rounded once from the fp32 result (the handle
// disallows reduced-precision split-K reductions, so no partial sum is rounded).
void gemm_ex(cublasHandle_t h, bool ta, bool tb, long M, long N, long K, float alpha, const void* A, long lda,
             const void* B, long ldb, DType ab, float beta, void* C, DType ct, long ldc) {
  STRATA_CHECK_CUBLAS(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                   cuda_type(ab), static_cast<int>(ldb), A, cuda_type(ab), static_cast<int>(lda), &beta,
                                   C, cuda_type(ct), static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// Activations one block keeps from forward for backward, device memory (rows = B*T).
// `h` is the model's precision (fp32, or the 16-bit type: rounded when stored).
struct BlockActsCuda {
  void* ln1;                   // [BT, d] h
  float *mean1, *rstd1;        // [BT], [BT]
  void* qkv;                   // [BT, 3d] h
  void* att;                   // [BT, d] h
  float* lse;                  // [B, H, T]
  float* x2;                   // [BT, d]  residual after attention
  void* ln2;                   // [BT, d] h
  float *mean2, *rstd2;        // [BT], [BT]
  float* fc;                   // [BT, 4d] before GELU (GELU's backward reads it); Llama [BT, 2 ffn] gate, up
  void* gel;                   // [BT, 4d] h, after GELU; Llama [BT, ffn] silu(gate) * up
  // Fused path: fc holds the pre-activation as type h (cuBLASLt's aux, [BT, 4d] at the
  // start of the buffer) instead of fp32; set by the forward that wrote it.
  bool pre_typed = false;
  void carve(Arena& a, long bt, const GptShape& s, DType h) {
    const int d = s.d_model;
    const long means = s.llama() ? 0 : bt;  // RMSNorm keeps no mean
    const long mlp_in = s.llama() ? 2L * s.ffn_dim() : 4L * d, mlp_mid = s.llama() ? s.ffn_dim() : 4L * d;
    ln1 = a.take_as(h, bt * d); mean1 = a.take<float>(means); rstd1 = a.take<float>(bt);
    qkv = a.take_as(h, bt * 3 * d);
    att = a.take_as(h, bt * d); lse = a.take<float>(bt * s.heads);
    x2 = a.take<float>(bt * d);
    ln2 = a.take_as(h, bt * d); mean2 = a.take<float>(means); rstd2 = a.take<float>(bt);
    fc = a.take<float>(bt * mlp_in); gel = a.take_as(h, bt * mlp_mid);
  }
};

struct GptCuda::Impl {
  GptShape s;
  GptOptions o;
  GptBlockLayout lay;
  LlamaBlockLayout llay;                   // Llama only
  bool llama;
  DType t;                                 // the precision: weights, gradients, 16-bit activations
  size_t es;                               // bytes per element of t
  bool half;                               // t is bf16 or fp16
  long bt_max = 0, chunk_rows = 0;
  long logits_ld = 0;                      // row pitch of the head's gradient chunk: V, or V rounded up to 8 in 16 bits
  // Device memory, all carved from `mem`:
  std::vector<float*> resid;               // [L+1][BT, d]: block inputs, then the final residual
  std::vector<BlockActsCuda> acts;         // L (no checkpointing) or 1 (recompute scratch)
  void* lnf;                               // [BT, d] h
  float *meanf, *rstdf;                    // [BT], [BT]
  float *dres, *dsmall, *dbig, *dqkv;      // gradients: [BT, d], [BT, d], [BT, 4d], [BT, 3d]
                                           // (dqkv also holds the qkv matmul's fp32 result in 16-bit forward,
                                           // and Llama's q, k, v projection in forward; Llama's dbig is
                                           // [BT, max(2 ffn, d + 2 kvd)])
  float* dmid = nullptr;                   // Llama: [BT, ffn] gradient of SwiGLU's output
  float *rope_cos = nullptr, *rope_sin = nullptr;  // Llama: [seq_len, head_dim / 2], as gpt_cpu.hpp's
  float* logits;                           // [chunk rows, V] (in fp32 also the head's gradient, in place)
  float* dot;                              // [B, H, T] attention backward scratch
  cu::AttentionKernels attention;          // from STRATA_ATTENTION, at construction
  void* attn_scratch = nullptr;            // Gemm attention: its scores, attn_scratch_bytes
  uint64_t attn_scratch_bytes = 0;         // bytes; 0 for the flash kernels
  float* row_loss;                         // [BT]
  int32_t *inputs, *targets;               // [BT] token ids, copied from the host
  // 16-bit only (null in fp32):
  void* dh = nullptr;                      // [BT, 4d] h (Llama: as dbig): an activation gradient rounded for the matmuls
  void* dlogits = nullptr;                 // [chunk rows, logits_ld] h: the head's rounded gradient
  float* dwte32 = nullptr;                 // [V, d] the tied wte gradient, head + embedding, rounded once at the end
                                           // (untied: the head's, then the embedding's, each rounded once)
  void* workspace = nullptr;               // kCublasWorkspaceBytes, cuBLAS's (16 bits) and cuBLASLt's (fused)
  // strata.cuda_kernels = "fused" only (cuda_kernel_plan.hpp; NOT yet run on a GPU):
  bool fused;
  std::unique_ptr<cu::LtMatmul> lt;        // the epilogue matmuls
  float* norm_partials = nullptr;          // partial_bytes_max: the norms' gain and the biases' gradients
  int sms = 1;                             // the GPU's multiprocessors (plan_norm)
  void* mem = nullptr;
  uint64_t bytes = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<float> host_loss;            // [BT] row losses, summed on the host in double

  struct CountOnly {};
  // Lays the buffers out without allocating: bytes only (activation_bytes).
  Impl(const GptShape& shape, const GptOptions& opts, CountOnly)
      : s(shape), o(opts), lay(gpt_block_layout(shape.d_model)), llama(shape.llama()), t(opts.precision),
        fused(opts.cuda_kernels == CudaKernels::Fused) {
    validate(s);
    if (s.has_lora())
      throw ConfigError("strata.lora runs on the cpu backend only for now: the cuda GPT has no adapter kernels; set "
                        "strata.backend to \"cpu\", or remove strata.lora to train the whole model on cuda");
    llay = llama_block_layout(s);
    if (o.micro_batch < 1) throw ConfigError("micro_batch = " + std::to_string(o.micro_batch) + " must be at least 1");
    if (!is_working_dtype(t))
      throw ConfigError(std::string("the cuda GPT computes in f32, bf16 or fp16, not ") + to_string(t));
    es = dtype_size(t);
    half = t != DType::F32;
    detail::check_checkpoint_options(o);
    attention = cu::attention_kernels_from_env();
    // The flash and mma kernels put batch x head on the grid's y dimension, at most 65535.
    if (attention != cu::AttentionKernels::Gemm && static_cast<long>(o.micro_batch) * s.heads > 65535)
      throw ConfigError("micro_batch x heads = " + std::to_string(static_cast<long>(o.micro_batch) * s.heads) +
                        " is more than the cuda flash and mma attention kernels' 65535 (batch x head) blocks; "
                        "lower train_micro_batch_size_per_gpu, or unset STRATA_ATTENTION");
    // The tensor-core kernels' limits that hold on any GPU: 16-bit, head dimensions in 16s.
    if (attention == cu::AttentionKernels::Mma) {
      const std::string why = attention_mma_refusal(s.head_dim(), t);
      if (!why.empty()) throw ConfigError(why);
    }
    Arena count;
    carve(count);
    bytes = count.used;
  }

  Impl(const GptShape& shape, const GptOptions& opts) : Impl(shape, opts, CountOnly{}) {
    const int head_dim = s.d_model / s.heads;
    if (attention == cu::AttentionKernels::Flash && cu::attention_tile(head_dim) == 0) {
      throw ConfigError("head dimension d_model / heads = " + std::to_string(head_dim) +
                        " is too large for the cuda flash attention kernels' shared memory on this GPU; use more "
                        "heads, or unset STRATA_ATTENTION");
    }
    if (attention == cu::AttentionKernels::Mma) {  // compute capability and shared memory
      const std::string why = cu::attention_mma_gpu_refusal(head_dim);
      if (!why.empty()) throw ConfigError(why);
    }
    cudaError_t rc = cudaMalloc(&mem, bytes);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw OutOfBudget("GptCuda: cudaMalloc of " + format_bytes(bytes) + " for activations failed: " +
                        cudaGetErrorString(rc));
    }
    Arena real{static_cast<char*>(mem), 0};
    carve(real);
    STRATA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    STRATA_CHECK_CUBLAS(cublasCreate(&blas));
    STRATA_CHECK_CUBLAS(cublasSetStream(blas, stream));
    if (!half) {
      // Plain fp32 (no TF32), so results match the cpu model's within fp32 rounding.
      STRATA_CHECK_CUBLAS(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    } else {
      // Tensor cores over the 16-bit operands with fp32 accumulation; a 16-bit output (the
      // weight gradients) is rounded once from fp32, never summed in 16 bits.
      STRATA_CHECK_CUBLAS(cublasSetMathMode(
          blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
      // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
      STRATA_CHECK_CUBLAS(cublasSetWorkspace(blas, workspace, kCublasWorkspaceBytes));
    }
    host_loss.resize(bt_max);
    if (llama) upload_rope_tables();
    if (fused) {
      lt = std::make_unique<cu::LtMatmul>(stream, workspace, kCublasWorkspaceBytes);
      sms = cu::multiprocessors();
    }
  }

  // The rotary tables (gpt_layout.hpp's rope_tables), computed on the host once.
  void upload_rope_tables() {
    std::vector<float> c(static_cast<size_t>(s.seq_len) * (s.head_dim() / 2)), sn(c.size());
    rope_tables(s, c.data(), sn.data());
    STRATA_CHECK_CUDA(cudaMemcpy(rope_cos, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice));
    STRATA_CHECK_CUDA(cudaMemcpy(rope_sin, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
    if (mem) cudaFree(mem);
  }

  // Lays every buffer out in `a` (counting only, when a has no base). In fp32 the layout
  // is the one before 16-bit training existed, plus the Gemm attention's scratch; the
  // 16-bit-only buffers come last.
  void carve(Arena& a) {
    const int d = s.d_model;
    bt_max = static_cast<long>(o.micro_batch) * s.seq_len;
    chunk_rows = std::clamp<long>(static_cast<long>(kLogitsChunkBytes / (4ull * s.vocab)), 1, bt_max);
    resid.assign(s.layers + 1, nullptr);  // the checkpoint store's buffers when checkpoints_from_source
    if (!o.checkpoints_from_source)
      for (auto& r : resid) r = a.take<float>(bt_max * d);
    acts.assign(o.checkpointing == ActivationCheckpointing::None ? s.layers : 1, BlockActsCuda{});
    for (auto& ac : acts) ac.carve(a, bt_max, s, t);
    lnf = a.take_as(t, bt_max * d); meanf = a.take<float>(llama ? 0 : bt_max); rstdf = a.take<float>(bt_max);
    // The widest matmul output whose gradient is taken: GPT-2's MLP (4d); Llama's gate and
    // up (2 ffn) or its q, k, v (d + 2 kvd).
    const long wide = llama ? std::max<long>(2L * s.ffn_dim(), d + 2L * s.kv_dim()) : 4L * d;
    dres = a.take<float>(bt_max * d); dsmall = a.take<float>(bt_max * d);
    dbig = a.take<float>(bt_max * wide); dqkv = a.take<float>(bt_max * 3 * d);
    if (llama) {
      dmid = a.take<float>(bt_max * s.ffn_dim());
      rope_cos = a.take<float>(static_cast<uint64_t>(s.seq_len) * (s.head_dim() / 2));
      rope_sin = a.take<float>(static_cast<uint64_t>(s.seq_len) * (s.head_dim() / 2));
    }
    logits = a.take<float>(static_cast<uint64_t>(chunk_rows) * s.vocab);
    dot = a.take<float>(bt_max * s.heads);
    if (attention == cu::AttentionKernels::Gemm) {  // sized for seq_len: enough for every shorter T
      attn_scratch_bytes = cu::attention_gemm_scratch_bytes(s.seq_len, s.heads, t);
      attn_scratch = a.take_bytes(attn_scratch_bytes);
    }
    row_loss = a.take<float>(bt_max);
    inputs = a.take<int32_t>(bt_max);
    targets = a.take<int32_t>(bt_max);
    logits_ld = s.vocab;
    if (fused) {
      norm_partials = static_cast<float*>(a.take_bytes(partial_bytes_max(bt_max, {d, 3 * d, static_cast<int>(wide)})));
      if (!half) workspace = a.take_bytes(kCublasWorkspaceBytes);
    }
    if (!half) return;
    // A pitch of 8 elements keeps every row of the gradient chunk 16-byte aligned for the
    // tensor cores whatever the vocabulary (GPT-2's 50257 is odd).
    logits_ld = (static_cast<long>(s.vocab) + 7) / 8 * 8;
    dh = a.take_as(t, bt_max * wide);
    dlogits = a.take_as(t, static_cast<uint64_t>(chunk_rows) * logits_ld);
    dwte32 = a.take<float>(static_cast<uint64_t>(s.vocab) * d);
    workspace = a.take_bytes(kCublasWorkspaceBytes);
  }

  // What attention runs on (its handle is on `stream`).
  cu::AttentionPath attention_path() const { return {attention, blas, attn_scratch, attn_scratch_bytes}; }

  BlockActsCuda& acts_for(int l) { return o.checkpointing == ActivationCheckpointing::None ? acts[l] : acts[0]; }

  // Element i of a buffer of type t (weights, gradients, 16-bit activations).
  const void* at(const void* p, uint64_t i) const { return static_cast<const char*>(p) + i * es; }
  void* at(void* p, uint64_t i) const { return static_cast<char*>(p) + i * es; }

  void sync() { STRATA_CHECK_CUDA(cudaStreamSynchronize(stream)); }
  // A bias gradient, the column sums of dY [M, N] (fp32): one thread a column on the
  // reference set; the fused set's over row chunks, then per column (norm_partials).
  void bias_grad(const float* dY, void* db, long M, int N) {
    if (!fused) return cu::column_sums(dY, db, t, M, N, stream);
    cu::column_sums_rows(dY, db, t, norm_partials, M, N, plan_norm(M, N, sms, false), stream);
  }
  void bind_adapters(const void* a, void*) { STRATA_CHECK(!a, "the cuda GPT has no LoRA adapters"); }
  // The point the stream has reached: the kernels queued so far.
  Event queued() { return record_cuda_event(stream); }
  // The WeightSource contract: the model is done with a buffer when it hands it back. It
  // hands it back with an event of the kernels still using it, and goes on queueing: the
  // source orders its own reuse of the memory after the event (release_params_after).
  void release(WeightSource& ws, int g) { ws.release_params_after(g, queued()); }
  void ready(WeightSource& ws, int g) { ws.grads_ready_after(g, queued()); }
  void bind_resid(int i, float* p) { resid[i] = p; }

  // Row-major C[M,N] = op(A) op(B) + beta C over operands of type t (fp32 accumulation);
  // C is fp32, or of type t (rounded once) where ct says so. fp32: sgemm.
  void matmul(bool ta, bool tb, long M, long N, long K, const void* A, long lda, const void* B, long ldb, float beta,
              void* C, DType ct, long ldc) {
    if (!half) {
      gemm(blas, ta, tb, M, N, K, 1.0f, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta,
           static_cast<float*>(C), ldc);
      return;
    }
    gemm_ex(blas, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, t, beta, C, ct, ldc);
  }

  // The driver's operations (gpt_driver.hpp) not defined below.
  void load_tokens(const int32_t* in, const int32_t* tgt, long n) {
    // Pageable host memory: the copy is staged before cudaMemcpyAsync returns.
    STRATA_CHECK_CUDA(cudaMemcpyAsync(inputs, in, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (tgt) STRATA_CHECK_CUDA(cudaMemcpyAsync(targets, tgt, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  // A block's parameters and gradient come through its views (group_view.hpp): whole, or
  // in parts (per-tensor gathers, tiles). A part goes back to the source with an event of
  // the kernels queued on it so far, with no synchronisation: the source waits for it
  // before it frees or reuses the memory.
  void block_forward(int l, detail::ParamView& pv, bool keep_output, int B, int T) {
    pv.set_fence([this] { return queued(); });
    float* out = keep_output ? resid[l + 1] : nullptr;
    if (llama) return llama_block_forward(pv, resid[l], acts_for(l), out, B, T);
    block_forward(pv, resid[l], acts_for(l), out, B, T);
  }
  void block_backward(int l, detail::ParamView& pv, detail::GradView& gv, int B, int T) {
    pv.set_fence([this] { return queued(); });
    gv.set_fence([this] { return queued(); });
    if (llama) return llama_block_backward(pv, resid[l], acts_for(l), gv, B, T);
    block_backward(pv, resid[l], acts_for(l), gv, B, T);
  }
  // With a checkpoint store (checkpoints_from_source) the driver hands the block's
  // checkpoint back to the store after release(): the kernels queued after the last part
  // went back (the residual adds) still write it, and backward's still read it, so the
  // stream is synchronised first. The model's own checkpoints need no wait: stream order.
  void release(detail::ParamView& pv) {
    if (o.checkpoints_from_source) sync();
    pv.release_all();
  }
  void ready(detail::GradView& gv) { gv.finish(); }
  // The norms, by strata.cuda_kernels: the reference kernels (one block per row, one thread
  // per gain column) or the fused ones (norm_cuda.cu, laid out by plan_norm). Same math.
  void ln_forward(const float* x, const void* w, const void* b, DType ty, void* y, float* mean, float* rstd, long rows,
                  int n, cudaStream_t st) {
    if (!fused) return cu::layernorm_forward(x, w, b, ty, y, mean, rstd, rows, n, st);
    cu::layernorm_forward_rows(x, w, b, ty, y, mean, rstd, rows, n, plan_norm(rows, n, sms, true), st);
  }
  void ln_backward(const float* dy, const float* x, const void* w, DType ty, const float* mean, const float* rstd,
                   float* dx, void* dw, void* db, long rows, int n, cudaStream_t st) {
    if (!fused) return cu::layernorm_backward(dy, x, w, ty, mean, rstd, dx, dw, db, rows, n, st);
    cu::layernorm_backward_rows(dy, x, w, ty, mean, rstd, dx, dw, db, norm_partials, rows, n,
                                plan_norm(rows, n, sms, true), st);
  }
  void rms_forward(const float* x, const void* w, DType ty, void* y, float* rstd, long rows, int n, float eps,
                   cudaStream_t st) {
    if (!fused) return cu::rmsnorm_forward(x, w, ty, y, rstd, rows, n, eps, st);
    cu::rmsnorm_forward_rows(x, w, ty, y, rstd, rows, n, eps, plan_norm(rows, n, sms, false), st);
  }
  void rms_backward(const float* dy, const float* x, const void* w, DType ty, const float* rstd, float* dx, void* dw,
                    long rows, int n, cudaStream_t st) {
    if (!fused) return cu::rmsnorm_backward(dy, x, w, ty, rstd, dx, dw, rows, n, st);
    cu::rmsnorm_backward_rows(dy, x, w, ty, rstd, dx, dw, norm_partials, rows, n, plan_norm(rows, n, sms, false), st);
  }

  // The final norm over rows of the final residual: LayerNorm, or Llama's RMSNorm.
  void final_norm(const float* x, const void* wf, long rows) {
    if (llama)
      rms_forward(x, wf, t, lnf, rstdf, rows, s.d_model, static_cast<float>(s.norm_eps), stream);
    else
      ln_forward(x, wf, at(wf, s.d_model), t, lnf, meanf, rstdf, rows, s.d_model, stream);
  }
  // The output head's weights: wte (tied) or Llama's lm_head after the final norm's gain.
  const void* head_of(const void* wf, const void* wte) const { return s.tied() ? wte : at(wf, s.d_model); }
  void last_logits(const void* wf, const void* wte_in, int len, float* out) {
    const int d = s.d_model, V = s.vocab;
    const float* x = resid[s.layers] + static_cast<long>(len - 1) * d;
    const void* wte = head_of(wf, wte_in);
    final_norm(x, wf, 1);
    if (!half) {
      // logits = wte [V, d] lnf [d]: column-major, wte is [d, V], so its transpose times lnf.
      const float one = 1.0f, zero = 0.0f;
      STRATA_CHECK_CUBLAS(cublasSgemv(blas, CUBLAS_OP_T, d, V, &one, static_cast<const float*>(wte), d,
                                      static_cast<const float*>(lnf), 1, &zero, logits, 1));
    } else {
      matmul(false, true, 1, V, d, lnf, d, wte, d, 0.0f, logits, DType::F32, V);  // [1, d] wte^T
    }
    STRATA_CHECK_CUDA(
        cudaMemcpyAsync(out, logits, static_cast<size_t>(V) * sizeof(float), cudaMemcpyDeviceToHost, stream));
    sync();
  }

  // Y[M,N] = X[M,K] W[N,K]^T (fp32 Y) for the [N, K] matrix W at element `off` of a block:
  // one matmul, or one per tile (a part holding rows [r0, r1) of W gives Y's columns
  // [r0, r1)), each tile released once its matmul is queued (after the view's fence).
  void matmul_rows(const void* X, detail::ParamView& w, uint64_t off, float* Y, long M, int N, int K) {
    for (const detail::RowSpan& r : w.rows(off, N, K)) {
      const uint64_t o = off + static_cast<uint64_t>(r.r0) * static_cast<uint64_t>(K);
      matmul(false, true, M, r.r1 - r.r0, K, X, K, w.at(o), K, 0.0f, Y + r.r0, DType::F32, N);
      w.done(o, static_cast<uint64_t>(r.r1 - r.r0) * static_cast<uint64_t>(K));
    }
  }
  // Y = X W^T + b (+ residual R [M, N], fp32) (fp32 Y); the bias [N] at element `bias` of
  // the block. The bias is read first, as the cpu model reads it, so both ask the source
  // for parts in the same order.
  void linear(const void* X, detail::ParamView& w, uint64_t off, uint64_t bias, float* Y, long M, int N, int K,
              const float* residual = nullptr) {
    const void* b = w.at(bias);
    if (!lt_forward(X, w, off, b, Y, DType::F32, residual, nullptr, M, N, K)) {
      matmul_rows(X, w, off, Y, M, N, K);
      cu::add_bias_rows(Y, b, t, M, N, stream);
      if (residual) cu::add_into(Y, residual, M * N, stream);
    }
    w.done(bias, static_cast<uint64_t>(N));
  }
  // Y = X W^T + R (fp32): Llama's projections into the residual stream (no bias).
  void matmul_rows_plus(const void* X, detail::ParamView& w, uint64_t off, float* Y, long M, int N, int K,
                        const float* residual) {
    if (lt_forward(X, w, off, nullptr, Y, DType::F32, residual, nullptr, M, N, K)) return;
    matmul_rows(X, w, off, Y, M, N, K);
    cu::add_into(Y, residual, M * N, stream);
  }
  // GPT-2's fc: a.gel = round(gelu(X W^T + b)), the pre-activation kept in a.fc (fp32; as
  // type t when the fused epilogue wrote it, a.pre_typed).
  void linear_gelu(const void* X, detail::ParamView& w, uint64_t off, uint64_t bias, BlockActsCuda& a, long M, int N,
                   int K) {
    const void* b = w.at(bias);
    a.pre_typed = lt_forward(X, w, off, b, a.gel, t, nullptr, a.fc, M, N, K);
    if (!a.pre_typed) {
      matmul_rows(X, w, off, a.fc, M, N, K);
      cu::add_bias_rows(a.fc, b, t, M, N, stream);
      cu::gelu_forward(a.fc, a.gel, t, M * N, stream);
    }
    w.done(bias, static_cast<uint64_t>(N));
  }

  // ---- the fused path's matmuls (strata.cuda_kernels = "fused"; NOT yet run on a GPU) ----
  static uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
  // One cuBLASLt product as choose_epilogue plans it for r (A and B in the plan's order);
  // false: nothing queued, the caller runs the reference path.
  bool lt_run(EpilogueRequest r, const void* a, const void* b, const void* c, void* d, void* bias, void* aux) {
    if (!lt) return false;
    r.ab = t;
    r.out_addr = addr(d), r.bias_addr = addr(bias), r.aux_addr = addr(aux);
    const EpiloguePlan plan = choose_epilogue(r);
    if (plan.fallback) lt->note_fallback(r.product, plan.reason);
    return lt->run(plan, {a, b, c, d, bias, aux, t, r.out, t});
  }
  // Y (type out) = X W^T (+ b) (+ R), or with aux: Y = gelu(X W^T + b), aux = X W^T + b.
  // Whole weights only: a tiled one (several row spans) runs the reference path, each
  // tile released after its product. True: queued, and W is done.
  bool lt_forward(const void* X, detail::ParamView& w, uint64_t off, const void* b, void* Y, DType out,
                  const float* residual, void* aux, long M, int N, int K) {
    if (!lt || w.rows(off, N, K).size() != 1) return false;
    EpilogueRequest r{.product = aux ? LinearProduct::ForwardGelu : LinearProduct::Forward, .M = M, .N = N, .K = K,
                      .out = out, .bias = b != nullptr, .residual = residual != nullptr, .aux_ld = N};
    if (!lt_run(r, w.at(off), X, residual, Y, const_cast<void*>(b), aux)) return false;
    w.done(off, static_cast<uint64_t>(N) * static_cast<uint64_t>(K));
    return true;
  }
  // The same stored as type t: round(X W^T + b), the fp32 product held in `scratch`.
  void linear_rounded(const void* X, detail::ParamView& w, uint64_t off, uint64_t bias, void* Y, float* scratch,
                      long M, int N, int K) {
    if (!half) return linear(X, w, off, bias, static_cast<float*>(Y), M, N, K);
    const void* b = w.at(bias);
    if (lt_forward(X, w, off, b, Y, t, nullptr, nullptr, M, N, K)) return w.done(bias, static_cast<uint64_t>(N));
    matmul_rows(X, w, off, scratch, M, N, K);
    cu::add_bias_rows_to(scratch, b, t, Y, M, N, stream);
    w.done(bias, static_cast<uint64_t>(N));
  }

  static constexpr uint64_t kNoBias = UINT64_MAX;  // a linear without bias (Llama's)

  // GELU's backward folded into the data gradient before it (fused path, GPT-2's MLP).
  struct DGelu {
    const void* pre;    // a.fc: the pre-activation, type t when pre_typed, else fp32
    bool pre_typed;
    void* db;           // fc's bias gradient
    bool done = false;  // set: dX holds round((dY W) gelu'(pre)) as type t, and db is written
  };
  // The fused path's linear backward, whole weights and a whole group only (false before
  // anything is queued otherwise): dY (fp32; or gy, already of type t, and no bias), then
  // dX = dY W (or, with dg, with GELU's derivative and fc's bias gradient in the epilogue)
  // and dW = dY^T X with db in the epilogue (BGRADB). A product cuBLASLt will not run
  // falls back to cuBLAS and the reference kernels on its own.
  bool lt_backward(const float* dY, const void* gy, const void* X, detail::ParamView& w, uint64_t off, uint64_t bias,
                   float* dX, detail::GradView& g, long M, int N, int K, DGelu* dg) {
    if (!lt || g.parts() != 1 || w.rows(off, N, K).size() != 1) return false;
    void* db = bias != kNoBias ? g.at(bias) : nullptr;
    if (!gy) {
      gy = dY;
      if (half) {
        cu::round_to(dY, dh, t, M * N, stream);
        gy = dh;
      }
    }
    const void* W = w.at(off);
    if (dX) {
      bool done = false;
      if (dg && (dg->pre_typed || !half)) {
        EpilogueRequest r{.product = LinearProduct::DataGradDGelu, .M = M, .N = N, .K = K, .out = t, .aux_ld = K};
        done = lt_run(r, W, gy, nullptr, dX, dg->db, const_cast<void*>(dg->pre));
      }
      if (dg) dg->done = done;
      if (!done) matmul(false, false, M, K, N, gy, N, W, K, 0.0f, dX, DType::F32, K);
    }
    const uint64_t n = static_cast<uint64_t>(N) * static_cast<uint64_t>(K);
    w.done(off, n);
    EpilogueRequest r{.product = LinearProduct::WeightGrad, .M = M, .N = N, .K = K, .out = t, .bias = db != nullptr};
    if (!lt_run(r, X, gy, nullptr, g.at(off), db, nullptr)) {
      if (db) bias_grad(dY, db, M, N);  // dY is fp32 wherever a bias is asked for
      matmul(true, false, N, K, M, gy, N, X, K, 0.0f, g.at(off), t, K);
    }
    if (db) g.wrote(bias, static_cast<uint64_t>(N));
    g.wrote(off, n);
    return true;
  }

  // dY (fp32) in. First db = colsum(dY) (summed in fp32 over the fp32 dY, rounded once) at
  // element `bias` of the block unless kNoBias, as the cpu model takes it first; then, in 16
  // bits, dY is rounded for the matmuls. For the [N, K] matrix W at element `off`, tile by
  // tile: dX = sum over tiles of dY[:, r0:r1] W[r0:r1] (fp32, the first overwrites; skipped
  // when null), and each tile's dW = dY[:, r0:r1]^T X (type t, rounded once), handed back
  // as soon as it is written.
  void linear_backward(const float* dY, const void* X, detail::ParamView& w, uint64_t off, uint64_t bias, float* dX,
                       detail::GradView& g, long M, int N, int K, DGelu* dg = nullptr) {
    if (lt_backward(dY, nullptr, X, w, off, bias, dX, g, M, N, K, dg)) return;
    if (bias != kNoBias) {
      bias_grad(dY, g.at(bias), M, N);
      g.wrote(bias, static_cast<uint64_t>(N));
    }
    const void* gy = dY;
    if (half) {
      cu::round_to(dY, dh, t, M * N, stream);
      gy = dh;
    }
    bool first = true;
    for (const detail::RowSpan& r : w.rows(off, N, K)) {
      const uint64_t o = off + static_cast<uint64_t>(r.r0) * static_cast<uint64_t>(K);
      const uint64_t n = static_cast<uint64_t>(r.r1 - r.r0) * static_cast<uint64_t>(K);
      const void* gyt = at(gy, static_cast<uint64_t>(r.r0));  // columns [r0, r1) of dY, row pitch N
      if (dX) matmul(false, false, M, K, r.r1 - r.r0, gyt, N, w.at(o), K, first ? 0.0f : 1.0f, dX, DType::F32, K);
      w.done(o, n);
      matmul(true, false, r.r1 - r.r0, K, M, gyt, N, X, K, 0.0f, g.at(o), t, K);
      g.wrote(o, n);
      first = false;
    }
  }

  void embed(const void* w, int B, int T) {
    const int d = s.d_model;
    cu::embed_forward(w, llama ? nullptr : at(w, static_cast<uint64_t>(s.vocab) * d), t, inputs, resid[0],
                      static_cast<long>(B) * T, T, d, stream);
  }

  // A norm's gain (and bias) read by a kernel just queued: done with them.
  static void done_vecs(detail::ParamView& w, std::initializer_list<uint64_t> offs, int n) {
    for (uint64_t o : offs) w.done(o, static_cast<uint64_t>(n));
  }
  static void wrote_vecs(detail::GradView& g, std::initializer_list<uint64_t> offs, int n) {
    for (uint64_t o : offs) g.wrote(o, static_cast<uint64_t>(n));
  }

  void block_forward(detail::ParamView& w, const float* x, BlockActsCuda& a, float* out, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    ln_forward(x, w.at(lay.ln1_w), w.at(lay.ln1_b), t, a.ln1, a.mean1, a.rstd1, bt, d, stream);
    done_vecs(w, {lay.ln1_w, lay.ln1_b}, d);
    // dqkv is free in forward (and in a recompute, before its block's backward).
    linear_rounded(a.ln1, w, lay.qkv_w, lay.qkv_b, a.qkv, dqkv, bt, 3 * d, d);
    cu::attention_forward(a.qkv, a.att, t, a.lse, B, T, d, s.heads, attention_path(), stream);
    linear(a.att, w, lay.attn_proj_w, lay.attn_proj_b, a.x2, bt, d, d, x);  // + the residual
    ln_forward(a.x2, w.at(lay.ln2_w), w.at(lay.ln2_b), t, a.ln2, a.mean2, a.rstd2, bt, d, stream);
    done_vecs(w, {lay.ln2_w, lay.ln2_b}, d);
    linear_gelu(a.ln2, w, lay.fc_w, lay.fc_b, a, bt, 4 * d, d);
    if (!out) return;
    linear(a.gel, w, lay.mlp_proj_w, lay.mlp_proj_b, out, bt, d, 4 * d, a.x2);
  }

  // dres: gradient of the block's output in, of its input out. g: the block's gradient.
  void block_backward(detail::ParamView& w, const float* x, BlockActsCuda& a, detail::GradView& g, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    mlp_backward(w, a, g, bt);
    ln_backward(dsmall, a.x2, w.at(lay.ln2_w), t, a.mean2, a.rstd2, dres, g.at(lay.ln2_w),
                           g.at(lay.ln2_b), bt, d, stream);
    done_vecs(w, {lay.ln2_w}, d);
    wrote_vecs(g, {lay.ln2_w, lay.ln2_b}, d);
    linear_backward(dres, a.att, w, lay.attn_proj_w, lay.attn_proj_b, dsmall, g, bt, d, d);
    // The attention output's gradient feeds attention's products with V and P: rounded
    // as every matmul's dY is (in fp32 the kernels read dsmall itself).
    const void* dout = dsmall;
    if (half) {
      cu::round_to(dsmall, dh, t, bt * d, stream);
      dout = dh;
    }
    cu::attention_backward(a.qkv, a.att, t, a.lse, dout, dqkv, dot, B, T, d, s.heads, attention_path(), stream);
    linear_backward(dqkv, a.ln1, w, lay.qkv_w, lay.qkv_b, dsmall, g, bt, 3 * d, d);
    ln_backward(dsmall, x, w.at(lay.ln1_w), t, a.mean1, a.rstd1, dres, g.at(lay.ln1_w), g.at(lay.ln1_b),
                           bt, d, stream);
    done_vecs(w, {lay.ln1_w}, d);
    wrote_vecs(g, {lay.ln1_w, lay.ln1_b}, d);
  }

  // GPT-2's MLP backward: dres in, dsmall = the gradient of ln2's output. Fused, GELU's
  // derivative and fc's bias gradient ride on mlp_proj's data gradient where they can;
  // dbig then holds fc's output gradient already rounded to type t.
  void mlp_backward(detail::ParamView& w, BlockActsCuda& a, detail::GradView& g, long bt) {
    const int d = s.d_model;
    DGelu dg{a.fc, a.pre_typed, lt && g.parts() == 1 ? g.at(lay.fc_b) : nullptr};
    linear_backward(dres, a.gel, w, lay.mlp_proj_w, lay.mlp_proj_b, dbig, g, bt, d, 4 * d, dg.db ? &dg : nullptr);
    if (dg.done) {
      g.wrote(lay.fc_b, static_cast<uint64_t>(4 * d));
      STRATA_CHECK(lt_backward(nullptr, dbig, a.ln2, w, lay.fc_w, kNoBias, dsmall, g, bt, 4 * d, d, nullptr),
                   "the fused MLP backward lost its whole group between two products");
      return;
    }
    if (a.pre_typed)
      cu::gelu_backward_typed(dbig, a.fc, t, bt * 4 * d, stream);
    else
      cu::gelu_backward(dbig, a.fc, bt * 4 * d, stream);
    linear_backward(dbig, a.ln2, w, lay.fc_w, lay.fc_b, dsmall, g, bt, 4 * d, d);
  }

  // gpt_cpu_blocks.cpp's llama_block_forward: x [BT, d] -> a's activations; out = x + block(x) when
  // out is not null. dqkv holds the q, k, v projection (fp32) before rotation.
  void llama_block_forward(detail::ParamView& w, const float* x, BlockActsCuda& a, float* out, int B, int T) {
    const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
    const long bt = static_cast<long>(B) * T;
    const float eps = static_cast<float>(s.norm_eps);
    rms_forward(x, w.at(llay.attn_norm), t, a.ln1, a.rstd1, bt, d, eps, stream);
    done_vecs(w, {llay.attn_norm}, d);
    matmul_rows(a.ln1, w, llay.qkv_w, dqkv, bt, pw, d);
    cu::rope_expand(dqkv, rope_cos, rope_sin, a.qkv, t, bt, T, d, s.heads, s.kv(), stream);
    cu::attention_forward(a.qkv, a.att, t, a.lse, B, T, d, s.heads, attention_path(), stream);
    matmul_rows_plus(a.att, w, llay.o_w, a.x2, bt, d, d, x);
    rms_forward(a.x2, w.at(llay.mlp_norm), t, a.ln2, a.rstd2, bt, d, eps, stream);
    done_vecs(w, {llay.mlp_norm}, d);
    matmul_rows(a.ln2, w, llay.gate_up_w, a.fc, bt, 2 * ff, d);
    cu::swiglu_forward(a.fc, a.gel, t, bt, ff, stream);
    if (!out) return;
    matmul_rows_plus(a.gel, w, llay.down_w, out, bt, d, ff, a.x2);
  }

  // gpt_cpu_blocks.cpp's llama_block_backward: dres in (the output's gradient), out (the input's).
  void llama_block_backward(detail::ParamView& w, const float* x, BlockActsCuda& a, detail::GradView& g, int B,
                            int T) {
    const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
    const long bt = static_cast<long>(B) * T;
    linear_backward(dres, a.gel, w, llay.down_w, kNoBias, dmid, g, bt, d, ff);
    cu::swiglu_backward(dmid, a.fc, dbig, bt, ff, stream);
    linear_backward(dbig, a.ln2, w, llay.gate_up_w, kNoBias, dsmall, g, bt, 2 * ff, d);
    rms_backward(dsmall, a.x2, w.at(llay.mlp_norm), t, a.rstd2, dres, g.at(llay.mlp_norm), bt, d, stream);
    done_vecs(w, {llay.mlp_norm}, d);
    wrote_vecs(g, {llay.mlp_norm}, d);
    linear_backward(dres, a.att, w, llay.o_w, kNoBias, dsmall, g, bt, d, d);
    const void* dout = dsmall;
    if (half) {
      cu::round_to(dsmall, dh, t, bt * d, stream);
      dout = dh;
    }
    cu::attention_backward(a.qkv, a.att, t, a.lse, dout, dqkv, dot, B, T, d, s.heads, attention_path(), stream);
    cu::rope_reduce(dqkv, rope_cos, rope_sin, dbig, bt, T, d, s.heads, s.kv(), stream);
    linear_backward(dbig, a.ln1, w, llay.qkv_w, kNoBias, dsmall, g, bt, pw, d);
    rms_backward(dsmall, x, w.at(llay.attn_norm), t, a.rstd1, dres, g.at(llay.attn_norm), bt, d, stream);
    done_vecs(w, {llay.attn_norm}, d);
    wrote_vecs(g, {llay.attn_norm}, d);
  }

  // Final layer norm, tied head and mean cross-entropy over rows [0, bt) (targets already
  // on the device). With dwte, also backward: dwte (overwritten) gets the head's gradient
  // and dres the final residual's. In 16 bits the head's gradient goes to the fp32
  // dwte32 instead, where the embedding backward adds to it before it is rounded into
  // dwte once. Synchronises (the loss comes back to the host).
  // An untied head (Llama's lm_head) is in the final group: wte and dwte are null, and
  // its gradient goes to dlnf_wb's, after the norm's gain.
  double head(const void* wf, const void* wte_in, long bt, void* dwte_in, void* dlnf_wb, float loss_scale,
              bool backward) {
    STRATA_CHECK(backward == (dlnf_wb != nullptr), "the cuda GPT's head has no frozen-base backward (LoRA is cpu only)");
    const int d = s.d_model, V = s.vocab;
    const float* xf = resid[s.layers];
    final_norm(xf, wf, bt);
    const void* wte = head_of(wf, wte_in);
    void* dwte = !dlnf_wb ? nullptr : s.tied() ? dwte_in : at(dlnf_wb, d);
    const float inv_n = loss_scale / static_cast<float>(bt);  // the gradient's scale
    // The gradient of a chunk's logits: in place over the fp32 logits, or rounded to the
    // 16-bit chunk (after the loss scale: fp16's small gradients survive the rounding).
    void* dlog = dwte == nullptr ? nullptr : half ? dlogits : static_cast<void*>(logits);
    float* dwte_acc = half ? dwte32 : static_cast<float*>(dwte);
    for (long r0 = 0; r0 < bt; r0 += chunk_rows) {
      const long nr = std::min(chunk_rows, bt - r0);
      matmul(false, true, nr, V, d, at(lnf, r0 * d), d, wte, d, 0.0f, logits, DType::F32, V);
      cu::cross_entropy_rows(logits, targets + r0, row_loss + r0, nr, V, inv_n, dlog, t, logits_ld, stream);
      if (!dwte) continue;
      matmul(false, false, nr, d, V, dlog, logits_ld, wte, d, 0.0f, dsmall + r0 * d, DType::F32, d);
      matmul(true, false, V, d, nr, dlog, logits_ld, at(lnf, r0 * d), d, r0 == 0 ? 0.0f : 1.0f, dwte_acc, DType::F32,
             d);
    }
    if (dwte) {
      STRATA_CHECK_CUDA(cudaMemsetAsync(dres, 0, bt * d * sizeof(float), stream));
      if (llama)
        rms_backward(dsmall, xf, wf, t, rstdf, dres, dlnf_wb, bt, d, stream);
      else
        ln_backward(dsmall, xf, wf, t, meanf, rstdf, dres, dlnf_wb, at(dlnf_wb, d), bt, d, stream);
      // An untied head's gradient is complete: rounded into the final group once.
      if (half && !s.tied()) cu::round_to(dwte32, dwte, t, static_cast<long>(V) * d, stream);
    }
    STRATA_CHECK_CUDA(
        cudaMemcpyAsync(host_loss.data(), row_loss, bt * sizeof(float), cudaMemcpyDeviceToHost, stream));
    sync();
    double loss = 0;
    for (long i = 0; i < bt; ++i) loss += host_loss[i];
    return loss / static_cast<double>(bt);
  }

  // Adds the embedding gradient to the wte part (the head's, in fp32: g0 itself, or
  // dwte32 rounded into g0 here in 16 bits); wpe's part is written.
  void embed_backward(void* g0, int B, int T) {
    const int d = s.d_model;
    const uint64_t wte_numel = static_cast<uint64_t>(s.vocab) * d;
    if (llama) {  // no position table; an untied head left nothing to add to
      float* acc = half ? dwte32 : static_cast<float*>(g0);
      if (!s.tied()) STRATA_CHECK_CUDA(cudaMemsetAsync(acc, 0, wte_numel * sizeof(float), stream));
      cu::embed_backward(dres, inputs, acc, nullptr, t, B, T, d, stream);
      if (half) cu::round_to(dwte32, g0, t, static_cast<long>(wte_numel), stream);
      return;
    }
    void* dwpe = at(g0, wte_numel);
    // All-zero bits are +0 in every element type.
    STRATA_CHECK_CUDA(cudaMemsetAsync(dwpe, 0, static_cast<size_t>(s.seq_len) * d * es, stream));
    cu::embed_backward(dres, inputs, half ? dwte32 : static_cast<float*>(g0), dwpe, t, B, T, d, stream);
    if (half) cu::round_to(dwte32, g0, t, static_cast<long>(wte_numel), stream);
  }
};

GptCuda::GptCuda(const GptShape& shape, const GptOptions& opts)
    : GptModel(shape, opts), impl_(std::make_unique<Impl>(shape, opts)) {}
GptCuda::~GptCuda() = default;

double GptCuda::forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets, float loss_scale) {
  return detail::gpt_forward_backward(*impl_, ws, shape_, opts_, inputs, targets, loss_scale);
}

double GptCuda::forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) {
  return detail::gpt_forward_loss(*impl_, ws, shape_, opts_, inputs, targets);
}

void GptCuda::next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* out) {
  detail::gpt_next_token_logits(*impl_, ws, shape_, opts_, tokens, len, out);
}

uint64_t GptCuda::activation_bytes(const GptShape& s, const GptOptions& o) {
  return Impl(s, o, Impl::CountOnly{}).bytes;  // the constructor's layout, without allocating
}

uint64_t GptCuda::activation_bytes() const { return impl_->bytes; }

}  // namespace strata
