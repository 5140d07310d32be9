// The cpu GPT's construction and public entry points (gpt_cpu.hpp for the rest), the
// backend choice (make_gpt) and the matmul peak measurements.
#include "strata/model/gpt.hpp"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "attention16_cpu.hpp"
#include "gemm_cpu.hpp"
#include "gpt_cpu.hpp"
#include "strata/model/gpt_driver.hpp"
#include "parallel.hpp"
#include "strata/core/error.hpp"
#include "strata/model/cpu_sgemm.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/model/gpt_cuda.hpp"
#endif

namespace strata {

namespace {

// One chunk of [rows, vocab] fp32 logits. The 16-bit model's is larger: its tied-weight
// gradient dwte += dlogits^T lnf, summed over `rows`, runs at 284 GFLOP/s over 166 rows
// of GPT-2's vocabulary and 322 over 664 (oneDNN bf16, 2 cores); the fp32 model keeps the
// chunk it was validated with.
constexpr uint64_t kLogitsChunkBytes = 32ull << 20;
constexpr uint64_t kLogitsChunkBytes16 = 128ull << 20;

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

Gpt::Impl::Impl(const GptShape& shape, const GptOptions& opts, CountOnly)
    : s(shape), o(opts), lay(gpt_block_layout(shape.d_model)), llama(shape.llama()), t(opts.precision),
      half(t != DType::F32) {
  validate(s);
  llay = llama_block_layout(s);
  if (o.micro_batch < 1) throw ConfigError("micro_batch = " + std::to_string(o.micro_batch) + " must be at least 1");
  if (!is_working_dtype(t))
    throw ConfigError(std::string("GptOptions::precision ") + to_string(t) + " is not f32, bf16 or fp16");
  detail::check_checkpoint_options(o);
  frozen = s.has_lora();
  if (frozen && half)
    throw ConfigError("strata.lora trains in fp32 only for now (the adapters' matmuls have no 16-bit path): set "
                      "bf16.enabled and fp16.enabled to false, or remove strata.lora");
  lora = lora_sites(s);
  lora_scale = static_cast<float>(s.lora.scale());
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

Gpt::Impl::Impl(const GptShape& shape, const GptOptions& opts) : Impl(shape, opts, CountOnly{}) {
  HostBuffers real;
  carve(real);
  std::fill(ones.begin(), ones.end(), 1.0f);
  gemm.set_workspace(gemm_workspace.data(), gemm_workspace.size());
  if (llama) rope_tables(s, rope_cos.data(), rope_sin.data());
}

void Gpt::Impl::carve(HostBuffers& a) {
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
  if (frozen) {
    a.take(lora_u, static_cast<uint64_t>(bt_max) * s.lora.rank);
    a.take(lora_du, static_cast<uint64_t>(bt_max) * s.lora.rank);
    a.take(frozen_vec_grads, 13ull * d);
  }
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
uint64_t Gpt::Impl::converting_workspace() const {
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
  if (backend != Backend::Cuda && opts.cuda_kernels != CudaKernels::Reference)
    throw ConfigError(std::string("strata.cuda_kernels = \"") + to_string(opts.cuda_kernels) +
                      "\" selects kernels of the cuda backend, and strata.backend is \"" + to_string(backend) +
                      "\": set strata.backend to \"cuda\", or remove strata.cuda_kernels");
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

std::string cpu_matmul_path(DType precision) {
  const detail::Gemm16Choice& c = detail::gemm16_choice(precision);
  return c.path + " (" + c.why + ")";
}

}  // namespace strata
