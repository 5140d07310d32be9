#include "strata/model/gpt.hpp"

#include <cblas.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <tuple>

#include "attention16_cpu.hpp"
#include "attention_cpu.hpp"
#include "gemm_cpu.hpp"
#include "gpt_driver.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/gpt.hpp"
#include "strata/model/cpu_sgemm.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/model/gpt_cuda.hpp"
#endif

namespace strata {

using detail::GemmOutput;
using detail::GradView;
using detail::ParamView;
using detail::MatRef;
using detail::parallel_for;

namespace {

// One chunk of [rows, vocab] fp32 logits. The 16-bit model's is larger: its tied-weight
// gradient dwte += dlogits^T lnf, summed over `rows`, runs at 284 GFLOP/s over 166 rows
// of GPT-2's vocabulary and 322 over 664 (oneDNN bf16, 2 cores); the fp32 model keeps the
// chunk it was validated with.
constexpr uint64_t kLogitsChunkBytes = 32ull << 20;
constexpr uint64_t kLogitsChunkBytes16 = 128ull << 20;

// Splits rows [0, rows) in chunks of 64 over the cores: fn(r0, r1).
template <class Fn>
void for_row_chunks(long rows, Fn&& fn) {
  parallel_for((rows + 63) / 64, 1, [&](long c) { fn(c * 64, std::min(rows, c * 64 + 64)); });
}

// dx += LN backward of dy; dw, db overwritten with the parameter gradients.
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

// dx += RMSNorm backward of dy; dw overwritten with the gain's gradient.
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

// y += x over [rows, n], split over the cores.
void add_rows(float* y, const float* x, long rows, int n) {
  for_row_chunks(rows, [&](long r0, long r1) { detail::add_into(y + r0 * n, x + r0 * n, (r1 - r0) * n); });
}

// Denormal floats (below 1.2e-38) cost a microcode assist per operation on x86, 100x an
// ordinary one, and training makes many: softmax probabilities of unlikely tokens and
// attention weights of far keys (exp clamped to 1.6e-38), scaled by 1/rows, then fed to
// the head's and attention's matmuls. On the fortunes run the step time grew 0.48 ->
// 0.74 s over 300 steps from them. The model computes with flush-to-zero and
// denormals-are-zero (TensorFlow's CPU threads do the same); values that small carry no
// information at fp32 gradient scales. The calling thread's MXCSR is set for the call and
// restored after; parallel_for's threads inherit it. OpenBLAS's workers were created when
// the library loaded, so the first call stops them (blas_thread_shutdown_, when the BLAS
// is OpenBLAS) and OpenBLAS starts new ones, inheriting the flags, on its next call. The
// 16-bit model's oneDNN matmuls run on OpenMP's workers, which may have started before
// (measure_matmul_peak): the first 16-bit call sets the flags in each of them, as the first
// fp32 call does where oneDNN's sgemm replaces OpenBLAS's (cpu_sgemm.hpp).
extern "C" void blas_thread_shutdown_(void) __attribute__((weak));

// Whether the model's matmuls run on OpenMP's team (oneDNN's): in 16 bits, and in fp32
// where oneDNN's sgemm stands in for OpenBLAS's (cpu_sgemm.hpp).
bool on_openmp(DType precision) {
  return precision != DType::F32 || cpu_sgemm_choice().library == CpuSgemmLibrary::OneDnn;
}

class FlushDenormals {
 public:
#if defined(__SSE__)
  explicit FlushDenormals(DType precision) : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFtz | kDaz);
    static std::once_flag restart;
    std::call_once(restart, [] {
      if (blas_thread_shutdown_) blas_thread_shutdown_();
    });
    static std::once_flag omp;
    if (on_openmp(precision)) std::call_once(omp, detail::gemm_threads_flush_denormals);
  }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#else
  explicit FlushDenormals(DType) {}
#endif
};

// The threads the model's loops run on: those of its matmul library (parallel.hpp).
detail::LoopThreads loop_threads(DType precision) {
  return on_openmp(precision) ? detail::LoopThreads::OpenMp : detail::LoopThreads::Forked;
}

}  // namespace

// A host buffer whose element type is the model's precision: the activations that feed
// matmuls (fp32, or 16-bit copies rounded once where they are made).
struct TypedBuffer {
  DType type = DType::F32;
  std::vector<std::byte> bytes;
  void* data() { return bytes.data(); }
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  uint16_t* h16() { return reinterpret_cast<uint16_t*>(bytes.data()); }
  // The element at `row` rows of `width` elements in.
  void* at(long row, int width) { return bytes.data() + static_cast<size_t>(row) * width * dtype_size(type); }
};

// Sizes the model's host buffers, or only counts them (activation_bytes): one list of
// buffers serves both, as the cuda model's Arena does, so the count cannot drift.
struct HostBuffers {
  bool count_only = false;
  uint64_t bytes = 0;
  void take(std::vector<float>& v, uint64_t n) {
    bytes += n * sizeof(float);
    if (!count_only) v.resize(n);
  }
  void take_bytes(std::vector<std::byte>& v, uint64_t n) {
    bytes += n;
    if (!count_only) v.resize(n);
  }
  void take(TypedBuffer& v, uint64_t n, DType t) {
    v.type = t;
    bytes += n * dtype_size(t);
    if (!count_only) v.bytes.resize(n * dtype_size(t));
  }
};

// Activations one block keeps from forward for backward (all [rows = B*T] x width). "t":
// the model's precision (docs/mixed-precision.md); the rest fp32. Llama's blocks keep
// the same with RMSNorm (no means), q and rotated k, v repeated to every head, and the
// SwiGLU MLP: fc is [gate, up] (2 ffn), gel silu(gate) * up (ffn).
struct BlockActs {
  TypedBuffer ln1;                        // [BT, d] t
  std::vector<float> mean1, rstd1;        // [BT], [BT]   (mean: GPT-2 only)
  TypedBuffer qkv;                        // [BT, 3d] t   attention's q, k, v, one per head
  TypedBuffer att;                        // [BT, d] t
  std::vector<float> lse;                 // [B, H, T]
  std::vector<float> x2;                  // [BT, d]  residual after attention
  TypedBuffer ln2;                        // [BT, d] t
  std::vector<float> mean2, rstd2;        // [BT], [BT]
  std::vector<float> fc;                  // [BT, 4d] before GELU; Llama [BT, 2 ffn]
  TypedBuffer gel;                        // [BT, 4d] t, after GELU; Llama [BT, ffn]
  void carve(HostBuffers& a, long bt, const GptShape& s, DType t) {
    const int d = s.d_model;
    const uint64_t means = s.llama() ? 0 : bt;
    const uint64_t mlp_in = s.llama() ? 2ull * s.ffn_dim() : 4ull * d, mlp_mid = s.llama() ? s.ffn_dim() : 4ull * d;
    a.take(ln1, bt * d, t); a.take(mean1, means); a.take(rstd1, bt);
    a.take(qkv, bt * 3 * d, t);
    a.take(att, bt * d, t); a.take(lse, static_cast<uint64_t>(bt) * s.heads);
    a.take(x2, bt * d);
    a.take(ln2, bt * d, t); a.take(mean2, means); a.take(rstd2, bt);
    a.take(fc, bt * mlp_in); a.take(gel, bt * mlp_mid, t);
  }
};

// A parameter vector (layer-norm gain or bias, linear bias) of a group: the model reads
// and writes these in fp32, in 16 bits through a scratch copy at `slot`.
struct VecRef {
  uint64_t offset;  // elements into the group
  int n;
  long slot;        // floats into the vector scratch
};

struct Gpt::Impl {
  GptShape s;
  GptOptions o;
  GptBlockLayout lay;
  LlamaBlockLayout llay;                  // Llama only
  bool llama;
  DType t;                                // the precision: weights, gradients, matmul operands
  bool half;                              // t is BF16 or F16
  long bt_max;
  long chunk_rows;
  std::vector<float*> resid;              // [L+1][BT, d]: block inputs, then the final residual: resid_own's,
  std::vector<std::vector<float>> resid_own;  // or the checkpoint store's (GptOptions::checkpoints_from_source)
  std::vector<BlockActs> acts;            // L (no checkpointing) or 1 (recompute scratch)
  TypedBuffer lnf;                        // [BT, d] t
  std::vector<float> meanf, rstdf;        // [BT], [BT]
  std::vector<float> dres, dsmall, dbig, dqkv;  // gradients: [BT, d], [BT, d], [BT, 4d], [BT, 3d]
                                          // (Llama: dbig [BT, max(2 ffn, d + 2 kvd)]; dqkv also
                                          // the q, k, v projection's output in forward)
  std::vector<float> dmid;                // Llama: [BT, ffn] gradient of SwiGLU's output
  std::vector<float> rope_cos, rope_sin;  // Llama: [seq_len, head_dim / 2]
  std::vector<float> logits;              // [chunk rows, V]
  std::vector<float> ones;                // [BT] for column sums (fp32 only: bias gradients)
  // 16 bits only (empty in fp32):
  TypedBuffer dy;                         // [max(BT * 4d, chunk rows * V)] t: a gradient rounded for a matmul
  std::vector<float> vecs, vec_grads;     // [13d] a group's parameter vectors and their gradients
  std::vector<float> col_parts;           // [threads, 4d] partial column sums (bias gradients)
  std::vector<float> dembed;              // [V + T, d] the embeddings' gradient (wte's tied)
  std::vector<std::byte> att_workspace;   // attention16's, one scratch per core
  // Converting matmuls only (gemm_native(t) false): wte as fp32 [V, d], and the gemm's workspace.
  std::vector<float> wte32, gemm_workspace;
  std::array<VecRef, 8> block_vecs;       // ln1 w, b; qkv b; attn proj b; ln2 w, b; fc b; mlp proj b
  std::array<VecRef, 2> final_vecs;       // ln_f w, b
  std::array<VecRef, 2> llama_vecs;       // input_layernorm, post_attention_layernorm
  std::array<VecRef, 1> llama_final;      // norm
  detail::CpuGemm gemm;
  uint64_t bytes = 0;                     // every buffer above (activation_bytes)
  const int32_t* inputs = nullptr;        // the caller's host arrays, this micro-batch
  const int32_t* targets = nullptr;

  enum { kLn1W, kLn1B, kQkvB, kProjB, kLn2W, kLn2B, kFcB, kMlpProjB };

  struct CountOnly {};
  // Lays the buffers out without allocating: bytes only (activation_bytes).
  Impl(const GptShape& shape, const GptOptions& opts, CountOnly)
      : s(shape), o(opts), lay(gpt_block_layout(shape.d_model)), llama(shape.llama()), t(opts.precision),
        half(t != DType::F32) {
    validate(s);
    llay = llama_block_layout(s);
    if (o.micro_batch < 1) throw ConfigError("micro_batch = " + std::to_string(o.micro_batch) + " must be at least 1");
    if (!is_working_dtype(t))
      throw ConfigError(std::string("GptOptions::precision ") + to_string(t) + " is not f32, bf16 or fp16");
    detail::check_checkpoint_options(o);
    bt_max = static_cast<long>(o.micro_batch) * s.seq_len;
    const uint64_t chunk_bytes = half ? kLogitsChunkBytes16 : kLogitsChunkBytes;
    chunk_rows = std::clamp<long>(static_cast<long>(chunk_bytes / (4ull * s.vocab)), 1, bt_max);
    const int d = s.d_model;
    block_vecs = {VecRef{lay.ln1_w, d, 0},        {lay.ln1_b, d, d},       {lay.qkv_b, 3 * d, 2L * d},
                  {lay.attn_proj_b, d, 5L * d},   {lay.ln2_w, d, 6L * d},  {lay.ln2_b, d, 7L * d},
                  {lay.fc_b, 4 * d, 8L * d},      {lay.mlp_proj_b, d, 12L * d}};
    final_vecs = {VecRef{0, d, 0}, {static_cast<uint64_t>(d), d, d}};
    llama_vecs = {VecRef{llay.attn_norm, d, 0}, {llay.mlp_norm, d, d}};
    llama_final = {VecRef{0, d, 0}};
    HostBuffers count{true};
    carve(count);
    bytes = count.bytes;
  }

  Impl(const GptShape& shape, const GptOptions& opts) : Impl(shape, opts, CountOnly{}) {
    HostBuffers real;
    carve(real);
    std::fill(ones.begin(), ones.end(), 1.0f);
    gemm.set_workspace(gemm_workspace.data(), gemm_workspace.size());
    if (llama) rope_tables(s, rope_cos.data(), rope_sin.data());
  }

  void carve(HostBuffers& a) {
    const int d = s.d_model;
    resid.assign(s.layers + 1, nullptr);
    if (!o.checkpoints_from_source) {
      resid_own.resize(s.layers + 1);
      for (auto& r : resid_own) a.take(r, bt_max * d);
      for (int i = 0; i <= s.layers; ++i) resid[i] = resid_own[i].data();
    }
    acts.resize(o.checkpointing == ActivationCheckpointing::None ? s.layers : 1);
    for (BlockActs& b : acts) b.carve(a, bt_max, s, t);
    a.take(lnf, bt_max * d, t); a.take(meanf, llama ? 0 : bt_max); a.take(rstdf, bt_max);
    // The widest matmul output whose gradient is taken: GPT-2's MLP (4d); Llama's gate and
    // up (2 ffn) or its q, k, v (d + 2 kvd).
    const uint64_t wide = llama ? std::max<uint64_t>(2ull * s.ffn_dim(), d + 2ull * s.kv_dim()) : 4ull * d;
    a.take(dres, bt_max * d); a.take(dsmall, bt_max * d); a.take(dbig, bt_max * wide); a.take(dqkv, bt_max * 3 * d);
    if (llama) {
      a.take(dmid, static_cast<uint64_t>(bt_max) * s.ffn_dim());
      a.take(rope_cos, static_cast<uint64_t>(s.seq_len) * (s.head_dim() / 2));
      a.take(rope_sin, static_cast<uint64_t>(s.seq_len) * (s.head_dim() / 2));
    }
    a.take(logits, static_cast<uint64_t>(chunk_rows) * s.vocab);
    if (!half) {
      if (!llama) a.take(ones, bt_max);
      return;
    }
    a.take(dy, std::max<uint64_t>(bt_max * wide, static_cast<uint64_t>(chunk_rows) * s.vocab), t);
    a.take(vecs, 13L * d); a.take(vec_grads, 13L * d);
    if (!llama) a.take(col_parts, static_cast<uint64_t>(detail::model_threads()) * 4 * d);
    a.take(dembed, static_cast<uint64_t>(s.vocab + (llama ? 0 : s.seq_len)) * d);
    a.take_bytes(att_workspace, detail::attention16_workspace_bytes(t, s.seq_len, s.head_dim()));
    if (detail::gemm_native(t)) return;
    a.take(wte32, static_cast<uint64_t>(s.vocab) * d);
    a.take(gemm_workspace, converting_workspace());
  }

  // The largest workspace one of the model's matmuls takes when they convert to fp32: the
  // linears forward and backward, the head (its wte already fp32) and the last logits.
  uint64_t converting_workspace() const {
    const long bt = bt_max, nr = chunk_rows, V = s.vocab;
    const int d = s.d_model;
    const DType f = DType::F32;
    uint64_t need = 0;
    const int kvd = s.kv_dim(), ff = s.ffn_dim();
    const std::vector<std::tuple<int, int, DType>> linears =
        llama ? std::vector<std::tuple<int, int, DType>>{{d + 2 * kvd, d, f}, {d, d, f}, {2 * ff, d, f}, {d, ff, f}}
              : std::vector<std::tuple<int, int, DType>>{{3 * d, d, t}, {d, d, f}, {4 * d, d, f}, {d, 4 * d, f}};
    for (auto [N, K, out] : linears) {
      need = std::max(need, detail::gemm_workspace_floats(bt, N, K, t, t, out));  // forward
      need = std::max(need, detail::gemm_workspace_floats(bt, K, N, t, t, f));    // dX
      need = std::max(need, detail::gemm_workspace_floats(N, K, bt, t, t, t));    // dW
    }
    need = std::max(need, detail::gemm_workspace_floats(nr, V, d, t, f, f));  // logits
    need = std::max(need, detail::gemm_workspace_floats(nr, d, V, t, f, f));  // d lnf
    need = std::max(need, detail::gemm_workspace_floats(V, d, nr, t, t, f));  // d wte
    return need;
  }

  BlockActs& acts_for(int l) { return o.checkpointing == ActivationCheckpointing::None ? acts[l] : acts[0]; }

  // Element `offset` of a parameter or gradient group of type t.
  const void* at(const void* group, uint64_t offset) const {
    return static_cast<const std::byte*>(group) + offset * dtype_size(t);
  }
  void* at(void* group, uint64_t offset) const { return static_cast<std::byte*>(group) + offset * dtype_size(t); }

  // A parameter vector as fp32: the group's own elements, or converted into its slot.
  const float* vec(const void* w, const VecRef& v) {
    if (!half) return static_cast<const float*>(w) + v.offset;
    convert_to_f32(vecs.data() + v.slot, at(w, v.offset), t, v.n);
    return vecs.data() + v.slot;
  }
  // Where a vector's fp32 gradient is written: the gradient group itself, or its slot,
  // rounded into the group by round_vec_grads once complete.
  float* vec_grad(void* g, const VecRef& v) { return half ? vec_grads.data() + v.slot : static_cast<float*>(g) + v.offset; }
  void round_vec_grads(void* g, std::span<const VecRef> vs) {
    if (half)
      for (const VecRef& v : vs) convert_from_f32(at(g, v.offset), t, vec_grads.data() + v.slot, v.n);
  }

  // The same for a block, through its views (group_view.hpp): parts are acquired as they
  // are read and go once done (a vector read in place, fp32: after the operation that
  // read it, done(w, v)); gradient parts go back once written (wrote(g, v); in 16 bits the
  // vectors are written by round_vec_grads).
  const float* vec(ParamView& w, const VecRef& v) {
    if (!half) return static_cast<const float*>(w.at(v.offset));
    convert_to_f32(vecs.data() + v.slot, w.at(v.offset), t, v.n);
    w.done(v.offset, static_cast<uint64_t>(v.n));
    return vecs.data() + v.slot;
  }
  void done(ParamView& w, const VecRef& v) {
    if (!half) w.done(v.offset, static_cast<uint64_t>(v.n));
  }
  float* vec_grad(GradView& g, const VecRef& v) {
    return half ? vec_grads.data() + v.slot : static_cast<float*>(g.at(v.offset));
  }
  void wrote(GradView& g, const VecRef& v) {
    if (!half) g.wrote(v.offset, static_cast<uint64_t>(v.n));
  }
  void round_vec_grads(GradView& g, std::span<const VecRef> vs) {
    if (!half) return;
    for (const VecRef& v : vs) {
      convert_from_f32(g.at(v.offset), t, vec_grads.data() + v.slot, v.n);
      g.wrote(v.offset, static_cast<uint64_t>(v.n));
    }
  }
  // Element `col` of a row of a matrix of type ty at p.
  static const void* shifted(const void* p, DType ty, long col) {
    return static_cast<const std::byte*>(p) + static_cast<size_t>(col) * dtype_size(ty);
  }
  static void* shifted(void* p, DType ty, long col) {
    return static_cast<std::byte*>(p) + static_cast<size_t>(col) * dtype_size(ty);
  }

  // The driver's operations (gpt_driver.hpp).
  void load_tokens(const int32_t* in, const int32_t* tgt, long) {
    inputs = in;
    targets = tgt;
  }
  void release(WeightSource& ws, int g) { ws.release_params(g); }
  void ready(WeightSource& ws, int g) { ws.grads_ready(g); }
  void release(ParamView& w) { w.release_all(); }
  void ready(GradView& g) { g.finish(); }
  void bind_resid(int i, float* p) { resid[i] = p; }
  void block_forward(int l, ParamView& w, bool keep_output, int B, int T) {
    float* out = keep_output ? resid[l + 1] : nullptr;
    if (llama) return llama_block_forward(w, resid[l], acts_for(l), out, B, T);
    block_forward(w, resid[l], acts_for(l), out, B, T);
  }
  void block_backward(int l, ParamView& w, GradView& g, int B, int T) {
    if (llama) return llama_block_backward(w, resid[l], acts_for(l), g, B, T);
    block_backward(w, resid[l], acts_for(l), g, B, T);
  }

  // y = layernorm(x) over rows [0, rows), of y's type (rounded once when 16-bit).
  void layernorm(const float* x, const float* w, const float* b, TypedBuffer& y, float* mean, float* rstd, long rows,
                 int n) {
    for_row_chunks(rows, [&](long r0, long r1) {
      if (y.type == DType::F32) return detail::layernorm_rows(x, w, b, y.f32(), mean, rstd, r0, r1, n);
      std::vector<float> row(n);
      detail::layernorm_rows_16(x, w, b, y.h16(), y.type, mean, rstd, r0, r1, n, row.data());
    });
  }

  // Y[M,N] = X[M,K] W[N,K]^T + b: X, W of type t, Y of type yt. W is the [N, K] matrix at
  // element `off` of a block: one matmul, or one per tile (a part holding rows [r0, r1) of
  // W gives Y's columns [r0, r1)), each tile acquired just before and released just after.
  void linear(const void* X, ParamView& w, uint64_t off, const float* bias, void* Y, DType yt, long M, int N, int K) {
    for (const detail::RowSpan& r : w.rows(off, N, K)) {
      const uint64_t o = off + static_cast<uint64_t>(r.r0) * static_cast<uint64_t>(K);
      gemm.run(M, r.r1 - r.r0, K, {X, t, K}, {w.at(o), t, K, true}, bias ? bias + r.r0 : nullptr, shifted(Y, yt, r.r0),
               yt, N, GemmOutput::Overwrite);
      w.done(o, static_cast<uint64_t>(r.r1 - r.r0) * static_cast<uint64_t>(K));
    }
  }

  // The gradient dY [M, N] of a linear's output as its backward's matmuls read it, and
  // its bias gradient db = colsum(dY) (fp32). In fp32, dY itself; in 16 bits, dY rounded
  // once into `dy`, the column sums taken from the fp32 values in the same pass.
  const void* matmul_grad(const float* dY, float* db, long M, int N) {
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
  const void* gelu_matmul_grad(float* dg, const float* fc, float* db, long M, int N) {
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

  // sums[N] = column sums over M rows, one part of the rows per core: fn(r0, r1, part)
  // adds its rows into `part` (zeroed), and the parts are added in order.
  template <class Fn>
  void column_sums(float* sums, long M, int N, Fn&& fn) {
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

  // Backward of linear from dY as matmul_grad gives it: dX = dY W (fp32; skipped when
  // null), dW = dY^T X (type t, overwritten).
  void linear_backward(const void* dY, const void* X, ParamView& w, uint64_t off, float* dX, GradView& g, long M, int N,
                       int K) {
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
      gemm.run(r.r1 - r.r0, K, M, {dYt, t, N, true}, {X, t, K}, nullptr, g.at(o), t, K, GemmOutput::Overwrite);
      g.wrote(o, n);
      first = false;
    }
  }

  // wte as the head's matmuls read it: as stored, or converted to fp32 once per head when
  // matmuls of type t convert (rather than once per chunk and matmul).
  MatRef head_weights(const void* wte) {
    if (detail::gemm_native(t)) return {wte, t, s.d_model};
    for_row_chunks(s.vocab, [&](long r0, long r1) {
      convert_to_f32(wte32.data() + r0 * s.d_model, at(wte, r0 * s.d_model), t, (r1 - r0) * s.d_model);
    });
    return {wte32.data(), DType::F32, s.d_model};
  }

  // The output head's weights: wte (tied, group 0) or Llama's lm_head, after the final
  // norm's gain in the final group.
  const void* head_of(const void* wf, const void* wte) const { return s.tied() ? wte : at(wf, s.d_model); }

  void last_logits(const void* wf, const void* wte, int len, float* out) {
    const int d = s.d_model;
    const float* x = resid[s.layers] + static_cast<long>(len - 1) * d;
    const void* hw = head_of(wf, wte);
    float mean, rstd;
    float* row = half ? dsmall.data() : lnf.f32();
    if (llama)
      math::rmsnorm_row(x, vec(wf, llama_final[0]), row, d, static_cast<float>(s.norm_eps), &rstd);
    else
      math::layernorm_row(x, vec(wf, final_vecs[0]), vec(wf, final_vecs[1]), row, d, &mean, &rstd);
    if (!half) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, s.vocab, d, 1.0f, static_cast<const float*>(hw), d, row, 1, 0.0f, out,
                  1);
      return;
    }
    convert_from_f32(lnf.data(), t, row, d);
    gemm.run(1, s.vocab, d, {lnf.data(), t, d}, head_weights(hw).transposed(), nullptr, out, DType::F32, s.vocab,
             GemmOutput::Overwrite);
  }

  void embed(const void* w, int B, int T) {
    const int32_t* tok = inputs;
    const int d = s.d_model;
    float* x = resid[0];
    if (llama) {  // x = wte[token]: no positions (they are rotary, in attention)
      parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
        convert_to_f32(x + r * d, at(w, static_cast<uint64_t>(tok[r]) * d), t, d);
      });
      return;
    }
    if (!half) {
      const auto* wte = static_cast<const float*>(w);
      const float* wpe = wte + static_cast<long>(s.vocab) * d;
      parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
        const int t = static_cast<int>(r % T);
        const float* e = wte + static_cast<long>(tok[r]) * d;
        const float* p = wpe + static_cast<long>(t) * d;
        for (int c = 0; c < d; ++c) x[r * d + c] = e[c] + p[c];
      });
      return;
    }
    // x = float(wte[token]) + float(wpe[t]), in fp32.
    const long wpe0 = static_cast<long>(s.vocab) * d;
    parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
      convert_to_f32(x + r * d, at(w, static_cast<uint64_t>(tok[r]) * d), t, d);
      accumulate_f32(x + r * d, at(w, wpe0 + (r % T) * d), t, d);
    });
  }

  // Causal attention over a.qkv into a.att and a.lse, and its backward from dsmall (the
  // output's gradient) into dqkv: the fp32 tiles, or the 16-bit panels.
  void attention_forward(BlockActs& a, int B, int T) {
    if (half)
      return detail::attention16_forward(a.qkv.h16(), a.att.h16(), t, a.lse.data(), B, T, s.d_model, s.heads,
                                         att_workspace);
    detail::attention_forward(a.qkv.f32(), a.att.f32(), a.lse.data(), B, T, s.d_model, s.heads);
  }
  void attention_backward(BlockActs& a, int B, int T) {
    if (half)
      return detail::attention16_backward(a.qkv.h16(), a.att.h16(), t, a.lse.data(), dsmall.data(), dqkv.data(), B, T,
                                          s.d_model, s.heads, att_workspace);
    detail::attention_backward(a.qkv.f32(), a.att.f32(), a.lse.data(), dsmall.data(), dqkv.data(), B, T, s.d_model,
                               s.heads);
  }

  // x [BT, d] -> a's activations; writes x + block(x) to out when out is not null.
  void block_forward(ParamView& w, const float* x, BlockActs& a, float* out, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    const auto& v = block_vecs;
    layernorm(x, vec(w, v[kLn1W]), vec(w, v[kLn1B]), a.ln1, a.mean1.data(), a.rstd1.data(), bt, d);
    done(w, v[kLn1W]);
    done(w, v[kLn1B]);
    linear(a.ln1.data(), w, lay.qkv_w, vec(w, v[kQkvB]), a.qkv.data(), t, bt, 3 * d, d);
    done(w, v[kQkvB]);
    attention_forward(a, B, T);
    linear(a.att.data(), w, lay.attn_proj_w, vec(w, v[kProjB]), a.x2.data(), DType::F32, bt, d, d);
    done(w, v[kProjB]);
    float* x2 = a.x2.data();
    add_rows(x2, x, bt, d);
    layernorm(x2, vec(w, v[kLn2W]), vec(w, v[kLn2B]), a.ln2, a.mean2.data(), a.rstd2.data(), bt, d);
    done(w, v[kLn2W]);
    done(w, v[kLn2B]);
    linear(a.ln2.data(), w, lay.fc_w, vec(w, v[kFcB]), a.fc.data(), DType::F32, bt, 4 * d, d);
    done(w, v[kFcB]);
    const float* fc = a.fc.data();
    parallel_for((bt + 15) / 16, 1, [&](long c) {
      const long r0 = c * 16, r1 = std::min(bt, r0 + 16);
      if (half) return detail::gelu_forward_16(fc + r0 * 4 * d, a.gel.h16() + r0 * 4 * d, t, (r1 - r0) * 4 * d);
      detail::gelu_forward(fc + r0 * 4 * d, a.gel.f32() + r0 * 4 * d, (r1 - r0) * 4 * d);
    });
    if (!out) return;
    linear(a.gel.data(), w, lay.mlp_proj_w, vec(w, v[kMlpProjB]), out, DType::F32, bt, d, 4 * d);
    done(w, v[kMlpProjB]);
    add_rows(out, x2, bt, d);
  }

  // dres: gradient of the block's output in, of its input out. g: the block's gradient.
  void block_backward(ParamView& w, const float* x, BlockActs& a, GradView& g, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    const auto& v = block_vecs;
    float* dr = dres.data();
    // MLP: out = x2 + gelu(fc(ln2(x2))) Wp^T + bp
    const void* dy_proj = matmul_grad(dr, vec_grad(g, v[kMlpProjB]), bt, d);
    wrote(g, v[kMlpProjB]);
    linear_backward(dy_proj, a.gel.data(), w, lay.mlp_proj_w, dbig.data(), g, bt, d, 4 * d);
    const void* dy_fc = gelu_matmul_grad(dbig.data(), a.fc.data(), vec_grad(g, v[kFcB]), bt, 4 * d);
    wrote(g, v[kFcB]);
    linear_backward(dy_fc, a.ln2.data(), w, lay.fc_w, dsmall.data(), g, bt, 4 * d, d);
    layernorm_backward(dsmall.data(), a.x2.data(), vec(w, v[kLn2W]), a.mean2.data(), a.rstd2.data(), dr,
                       vec_grad(g, v[kLn2W]), vec_grad(g, v[kLn2B]), bt, d);
    done(w, v[kLn2W]);
    wrote(g, v[kLn2W]);
    wrote(g, v[kLn2B]);
    // Attention: x2 = x + attn(ln1(x)) Wo^T + bo
    const void* dy_att = matmul_grad(dr, vec_grad(g, v[kProjB]), bt, d);
    wrote(g, v[kProjB]);
    linear_backward(dy_att, a.att.data(), w, lay.attn_proj_w, dsmall.data(), g, bt, d, d);
    attention_backward(a, B, T);
    const void* dy_qkv = matmul_grad(dqkv.data(), vec_grad(g, v[kQkvB]), bt, 3 * d);
    wrote(g, v[kQkvB]);
    linear_backward(dy_qkv, a.ln1.data(), w, lay.qkv_w, dsmall.data(), g, bt, 3 * d, d);
    layernorm_backward(dsmall.data(), x, vec(w, v[kLn1W]), a.mean1.data(), a.rstd1.data(), dr, vec_grad(g, v[kLn1W]),
                       vec_grad(g, v[kLn1B]), bt, d);
    done(w, v[kLn1W]);
    wrote(g, v[kLn1W]);
    wrote(g, v[kLn1B]);
    round_vec_grads(g, v);
  }

  // ---- Llama ----------------------------------------------------------------------

  // A linear's output gradient [M, N] as its backward's matmuls read it (no bias): dY
  // itself in fp32, rounded once into `dy` in 16 bits.
  const void* grad_operand(const float* dY, long M, int N) {
    if (!half) return dY;
    for_row_chunks(M, [&](long r0, long r1) { convert_from_f32(dy.at(r0, N), t, dY + r0 * N, (r1 - r0) * N); });
    return dy.data();
  }

  // Rows [r0, r1) of fn(r, out_row) writing `width` floats per row into y (of y's type):
  // in place in fp32, through one row of scratch rounded once in 16 bits.
  template <class Fn>
  void rows_into(TypedBuffer& y, long rows, int width, Fn&& fn) {
    for_row_chunks(rows, [&](long r0, long r1) {
      std::vector<float> row(y.type == DType::F32 ? 0 : width);
      for (long r = r0; r < r1; ++r) {
        float* out = y.type == DType::F32 ? y.f32() + r * width : row.data();
        fn(r, out);
        if (y.type != DType::F32) convert_from_f32(y.at(r, width), t, out, width);
      }
    });
  }

  // y = RMSNorm(x) over rows [0, rows), of y's type (rounded once when 16-bit).
  void rmsnorm(const float* x, const float* w, TypedBuffer& y, float* rstd, long rows, int n) {
    const float eps = static_cast<float>(s.norm_eps);
    rows_into(y, rows, n, [&](long r, float* o) { detail::rmsnorm_rows(x + r * n, w, o, rstd + r, 0, 1, n, eps); });
  }

  // The projection p [BT, d + 2 kvd] (fp32) -> attention's q, k, v [BT, 3d]: q and k rotated
  // at their positions (rotate-half: channel i pairs with i + hd/2), then k and v repeated
  // to the heads / kv_heads query heads that share them (Hugging Face's repeat_kv).
  void rope_expand(const float* p, TypedBuffer& qkv, int T, long bt) {
    const int d = s.d_model, hd = s.head_dim(), h2 = hd / 2, H = s.heads, rep = H / s.kv(), kvd = s.kv_dim();
    const int pw = d + 2 * kvd;
    rows_into(qkv, bt, 3 * d, [&](long r, float* o) {
      const float* c = rope_cos.data() + (r % T) * h2;
      const float* sn = rope_sin.data() + (r % T) * h2;
      const float* pr = p + r * pw;
      auto rotate = [&](const float* x, float* y) {
        for (int i = 0; i < h2; ++i) {
          y[i] = x[i] * c[i] - x[i + h2] * sn[i];
          y[i + h2] = x[i + h2] * c[i] + x[i] * sn[i];
        }
      };
      for (int h = 0; h < H; ++h) {
        rotate(pr + h * hd, o + h * hd);
        rotate(pr + d + (h / rep) * hd, o + d + h * hd);
        std::copy_n(pr + d + kvd + (h / rep) * hd, hd, o + 2 * d + h * hd);
      }
    });
  }

  // Backward of rope_expand: dqkv [BT, 3d] -> dp [BT, d + 2 kvd], q and k rotated back
  // (the transpose), the repeated heads' k and v gradients summed into their kv head.
  void rope_reduce(const float* dqkv_full, float* dp, int T, long bt) {
    const int d = s.d_model, hd = s.head_dim(), h2 = hd / 2, H = s.heads, rep = H / s.kv(), kvd = s.kv_dim();
    const int pw = d + 2 * kvd;
    parallel_for(bt, 16, [&](long r) {
      const float* c = rope_cos.data() + (r % T) * h2;
      const float* sn = rope_sin.data() + (r % T) * h2;
      const float* g = dqkv_full + r * 3 * d;
      float* o = dp + r * pw;
      std::fill(o, o + pw, 0.0f);
      auto unrotate_add = [&](const float* x, float* y) {
        for (int i = 0; i < h2; ++i) {
          y[i] += x[i] * c[i] + x[i + h2] * sn[i];
          y[i + h2] += x[i + h2] * c[i] - x[i] * sn[i];
        }
      };
      for (int h = 0; h < H; ++h) {
        unrotate_add(g + h * hd, o + h * hd);
        unrotate_add(g + d + h * hd, o + d + (h / rep) * hd);
        detail::add_into(o + d + kvd + (h / rep) * hd, g + 2 * d + h * hd, hd);
      }
    });
  }

  // x [BT, d] -> a's activations; writes x + block(x) to out when out is not null.
  //   h = x + o_proj(attention(rope(q), rope(k), v of input_layernorm(x)))
  //   out = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
  void llama_block_forward(ParamView& w, const float* x, BlockActs& a, float* out, int B, int T) {
    const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
    const long bt = static_cast<long>(B) * T;
    rmsnorm(x, vec(w, llama_vecs[0]), a.ln1, a.rstd1.data(), bt, d);
    done(w, llama_vecs[0]);
    linear(a.ln1.data(), w, llay.qkv_w, nullptr, dqkv.data(), DType::F32, bt, pw, d);
    rope_expand(dqkv.data(), a.qkv, T, bt);
    attention_forward(a, B, T);
    float* x2 = a.x2.data();
    linear(a.att.data(), w, llay.o_w, nullptr, x2, DType::F32, bt, d, d);
    add_rows(x2, x, bt, d);
    rmsnorm(x2, vec(w, llama_vecs[1]), a.ln2, a.rstd2.data(), bt, d);
    done(w, llama_vecs[1]);
    linear(a.ln2.data(), w, llay.gate_up_w, nullptr, a.fc.data(), DType::F32, bt, 2 * ff, d);
    const float* gu = a.fc.data();
    rows_into(a.gel, bt, ff, [&](long r, float* o) { detail::swiglu_forward(gu + r * 2 * ff, o, 1, ff); });
    if (!out) return;
    linear(a.gel.data(), w, llay.down_w, nullptr, out, DType::F32, bt, d, ff);
    add_rows(out, x2, bt, d);
  }

  // dres: gradient of the block's output in, of its input out. g: the block's gradient.
  void llama_block_backward(ParamView& w, const float* x, BlockActs& a, GradView& g, int B, int T) {
    const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
    const long bt = static_cast<long>(B) * T;
    float* dr = dres.data();
    // MLP
    linear_backward(grad_operand(dr, bt, d), a.gel.data(), w, llay.down_w, dmid.data(), g, bt, d, ff);
    // SwiGLU's backward, the gradient of [gate, up] written as the matmuls read it: fp32
    // in dbig, or rounded once into dy.
    auto swiglu_grad = [&](long r, float* o) {
      detail::swiglu_backward(dmid.data() + r * ff, a.fc.data() + r * 2 * ff, o, 1, ff);
    };
    if (half)
      rows_into(dy, bt, 2 * ff, swiglu_grad);
    else
      for_row_chunks(bt, [&](long r0, long r1) {
        for (long r = r0; r < r1; ++r) swiglu_grad(r, dbig.data() + r * 2 * ff);
      });
    const void* dy_gu = half ? dy.data() : static_cast<const void*>(dbig.data());
    linear_backward(dy_gu, a.ln2.data(), w, llay.gate_up_w, dsmall.data(), g, bt, 2 * ff, d);
    rmsnorm_backward(dsmall.data(), a.x2.data(), vec(w, llama_vecs[1]), a.rstd2.data(), dr,
                     vec_grad(g, llama_vecs[1]), bt, d);
    done(w, llama_vecs[1]);
    wrote(g, llama_vecs[1]);
    // Attention
    linear_backward(grad_operand(dr, bt, d), a.att.data(), w, llay.o_w, dsmall.data(), g, bt, d, d);
    attention_backward(a, B, T);
    rope_reduce(dqkv.data(), dbig.data(), T, bt);
    linear_backward(grad_operand(dbig.data(), bt, pw), a.ln1.data(), w, llay.qkv_w, dsmall.data(), g, bt, pw, d);
    rmsnorm_backward(dsmall.data(), x, vec(w, llama_vecs[0]), a.rstd1.data(), dr, vec_grad(g, llama_vecs[0]), bt, d);
    done(w, llama_vecs[0]);
    wrote(g, llama_vecs[0]);
    round_vec_grads(g, llama_vecs);
  }

  // Final layer norm, tied head and mean cross-entropy over rows [0, bt). With dwte, also
  // backward: dwte (overwritten; in 16 bits, through dembed until embed_backward) gets the
  // head's gradient and dres the final residual's.
  // An untied head (Llama's lm_head) is in the final group: its gradient goes to dlnf's,
  // and dwte_group is null.
  double head(const void* wf, const void* wte, long bt, void* dwte_group, void* dlnf, float loss_scale) {
    const int d = s.d_model, V = s.vocab;
    const float* xf = resid[s.layers];
    const float* lnf_w = vec(wf, llama ? llama_final[0] : final_vecs[0]);
    if (llama)
      rmsnorm(xf, lnf_w, lnf, rstdf.data(), bt, d);
    else
      layernorm(xf, lnf_w, vec(wf, final_vecs[1]), lnf, meanf.data(), rstdf.data(), bt, d);
    const MatRef w = head_weights(head_of(wf, wte));
    void* dhead_group = s.tied() ? dwte_group : dlnf ? at(dlnf, d) : nullptr;
    float* dwte = !dhead_group ? nullptr : half ? dembed.data() : static_cast<float*>(dhead_group);
    double loss = 0;
    const float inv_n = loss_scale / static_cast<float>(bt);  // the gradient's scale
    float* dl = dsmall.data();  // gradient of lnf's output
    for (long r0 = 0; r0 < bt; r0 += chunk_rows) {
      const long nr = std::min(chunk_rows, bt - r0);
      float* lg = logits.data();
      gemm.run(nr, V, d, {lnf.at(r0, d), t, d}, w.transposed(), nullptr, lg, DType::F32, V, GemmOutput::Overwrite);
      std::vector<double> row_loss(nr);
      parallel_for(nr, 16, [&](long i) {
        float* z = lg + i * V;
        const int tgt = targets[r0 + i];
        const float zt = z[tgt];
        const float mx = detail::max_of(z, V);
        // z becomes exp(z - max); the loss is log(sum) - (z_t - max).
        const double sum = detail::exp_shifted(z, z, V, mx);
        row_loss[i] = std::log(sum) - static_cast<double>(zt - mx);
        if (dwte) {
          detail::scale_into(z, static_cast<float>(inv_n / sum), V);
          z[tgt] -= inv_n;
          if (half) convert_from_f32(dy.at(i, V), t, z, V);  // dlogits, rounded for both matmuls
        }
      });
      for (double v : row_loss) loss += v;
      if (!dwte) continue;
      const MatRef dlogits = half ? MatRef{dy.data(), t, V} : MatRef{lg, DType::F32, V};
      gemm.run(nr, d, V, dlogits, w, nullptr, dl + r0 * d, DType::F32, d, GemmOutput::Overwrite);
      gemm.run(V, d, nr, dlogits.transposed(), {lnf.at(r0, d), t, d}, nullptr, dwte, DType::F32, d,
               r0 == 0 ? GemmOutput::Overwrite : GemmOutput::Accumulate);
    }
    if (dwte) {
      std::fill(dres.begin(), dres.begin() + bt * d, 0.0f);
      if (llama) {
        rmsnorm_backward(dl, xf, lnf_w, rstdf.data(), dres.data(), vec_grad(dlnf, llama_final[0]), bt, d);
        round_vec_grads(dlnf, llama_final);
      } else {
        layernorm_backward(dl, xf, lnf_w, meanf.data(), rstdf.data(), dres.data(), vec_grad(dlnf, final_vecs[0]),
                           vec_grad(dlnf, final_vecs[1]), bt, d);
        round_vec_grads(dlnf, final_vecs);
      }
      if (half && !s.tied())  // lm_head's gradient is complete: rounded into the final group
        for_row_chunks(V, [&](long r0, long r1) {
          convert_from_f32(at(dhead_group, r0 * d), t, dembed.data() + r0 * d, (r1 - r0) * d);
        });
    }
    return loss / static_cast<double>(bt);
  }

  // Adds the embedding lookup's gradient to the head's in wte's part of g0 (dembed in 16
  // bits) and writes wpe's part; in 16 bits, g0 is then rounded once from dembed.
  void embed_backward(void* g0, int B, int T) {
    const int32_t* tok = inputs;
    const int d = s.d_model;
    float* dwte = half ? dembed.data() : static_cast<float*>(g0);
    if (!s.tied()) std::fill(dwte, dwte + static_cast<long>(s.vocab) * d, 0.0f);  // no head gradient to add to
    float* dwpe = llama ? nullptr : dwte + static_cast<long>(s.vocab) * d;
    if (dwpe) std::fill(dwpe, dwpe + static_cast<long>(s.seq_len) * d, 0.0f);
    const float* dr = dres.data();
    // Rows with the same token add into one wte row: each thread owns a range of channels.
    constexpr int kCols = 64;
    parallel_for((d + kCols - 1) / kCols, 1, [&](long cb) {
      const int c0 = static_cast<int>(cb) * kCols, c1 = std::min(d, c0 + kCols);
      for (long r = 0; r < static_cast<long>(B) * T; ++r) {
        const float* v = dr + r * d;
        float* e = dwte + static_cast<long>(tok[r]) * d;
        for (int c = c0; c < c1; ++c) e[c] += v[c];
        if (!dwpe) continue;
        float* p = dwpe + (r % T) * d;
        for (int c = c0; c < c1; ++c) p[c] += v[c];
      }
    });
    if (!half) return;
    for_row_chunks(s.vocab + (llama ? 0 : s.seq_len), [&](long r0, long r1) {
      convert_from_f32(at(g0, r0 * d), t, dembed.data() + r0 * d, (r1 - r0) * d);
    });
  }
};

Gpt::Gpt(const GptShape& shape, const GptOptions& opts)
    : GptModel(shape, opts), impl_(std::make_unique<Impl>(shape, opts)) {
  cpu_sgemm_choice();  // made (and a bad STRATA_CPU_SGEMM refused) here, before any step
}
Gpt::~Gpt() = default;

double Gpt::forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets, float loss_scale) {
  const FlushDenormals ftz(opts_.precision);
  const detail::UseLoopThreads loops(loop_threads(opts_.precision));
  return detail::gpt_forward_backward(*impl_, ws, shape_, opts_, inputs, targets, loss_scale);
}

double Gpt::forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) {
  const FlushDenormals ftz(opts_.precision);
  const detail::UseLoopThreads loops(loop_threads(opts_.precision));
  return detail::gpt_forward_loss(*impl_, ws, shape_, opts_, inputs, targets);
}

void Gpt::next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* out) {
  const FlushDenormals ftz(opts_.precision);
  const detail::UseLoopThreads loops(loop_threads(opts_.precision));
  detail::gpt_next_token_logits(*impl_, ws, shape_, opts_, tokens, len, out);
}

uint64_t Gpt::activation_bytes(const GptShape& s, const GptOptions& o) {
  return Impl(s, o, Impl::CountOnly{}).bytes;
}

uint64_t Gpt::activation_bytes() const { return impl_->bytes; }

namespace {

// The cpu matmul measurements' product: fp32 1024 x 1024 x 1024 through cpu_sgemm, every
// core; the first one at construction, to make the threads and warm the caches.
struct SquareSgemm {
  static constexpr int n = 1024;
  static constexpr double flops = 2.0 * n * n * static_cast<double>(n);
  std::vector<float> a, b, c;
  SquareSgemm() : a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size()) { run(); }
  void run() {
    cpu_sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }
};

}  // namespace

double measure_cpu_matmul_peak(double seconds) {
  SquareSgemm g;
  double best = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto t0 = std::chrono::steady_clock::now();
    g.run();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, SquareSgemm::flops / dt);
  } while (std::chrono::steady_clock::now() < until);
  return best;
}

MatmulRate cpu_matmul_rate_while(const std::function<bool()>& keep_going) {
  SquareSgemm g;
  uint64_t products = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    g.run();
    ++products;
  } while (keep_going());
  MatmulRate r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.flops_per_s = SquareSgemm::flops * static_cast<double>(products) / r.seconds;
  return r;
}

std::unique_ptr<GptModel> make_gpt(Backend backend, const GptShape& shape, const GptOptions& opts) {
  switch (backend) {
    case Backend::Cpu:
      return std::make_unique<Gpt>(shape, opts);
    case Backend::Cuda:
#ifdef STRATA_HAVE_CUDA
      return std::make_unique<GptCuda>(shape, opts);
#else
      throw ConfigError("strata.backend is 'cuda' but this build of Strata has no cuda backend (CMake found no CUDA "
                        "toolkit); rebuild with nvcc on PATH, or set strata.backend to \"cpu\"");
#endif
    case Backend::Sim:
      break;
  }
  throw ConfigError("the GPT does not run on the sim backend (its tensors have sizes but no bytes); use `strata plan "
                    "--simulate` to simulate a step, or set strata.backend to \"cpu\" or \"cuda\"");
}

double measure_matmul_peak(Backend backend, double seconds) {
  if (backend == Backend::Cuda) {
#ifdef STRATA_HAVE_CUDA
    return measure_cuda_matmul_peak(seconds);
#else
    throw ConfigError("measure_matmul_peak: this build has no cuda backend");
#endif
  }
  return measure_cpu_matmul_peak(seconds);
}

double measure_matmul_peak(Backend backend, DType precision, double seconds) {
  if (precision == DType::F32) return measure_matmul_peak(backend, seconds);
  if (!is_working_dtype(precision))
    throw ConfigError(std::string("measure_matmul_peak: ") + to_string(precision) + " is not f32, bf16 or fp16");
  if (backend == Backend::Cuda) {
#ifdef STRATA_HAVE_CUDA
    return measure_cuda_matmul_peak(precision, seconds);
#else
    throw ConfigError("measure_matmul_peak: this build has no cuda backend");
#endif
  }
  if (backend != Backend::Cpu)
    throw ConfigError(std::string("measure_matmul_peak: no ") + precision_name(precision) + " peak for the sim backend");
  return detail::measure_gemm_peak(precision, seconds);
}

}  // namespace strata
