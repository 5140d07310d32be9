#include "strata/model/gpt.hpp"

#include <cblas.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "attention_cpu.hpp"
#include "gpt_driver.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/math/gpt.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/model/gpt_cuda.hpp"
#endif

namespace strata {

using detail::parallel_for;

namespace {

constexpr uint64_t kLogitsChunkBytes = 32ull << 20;  // one chunk of [rows, vocab] logits

// Y[M,N] = X[M,K] W[N,K]^T + b
void linear(const float* X, const float* W, const float* bias, float* Y, long M, int N, int K) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), N, K, 1.0f, X, K, W, K, 0.0f, Y, N);
  parallel_for((M + 63) / 64, 1, [&](long c) {
    const long r0 = c * 64, r1 = std::min(M, r0 + 64);
    detail::add_bias_rows(Y + r0 * N, bias, r1 - r0, N);
  });
}

// Backward of linear: dX = dY W (beta: 0 overwrite, 1 accumulate), dW = dY^T X, db = colsum(dY).
void linear_backward(const float* dY, const float* X, const float* W, float* dX, float* dW, float* db, long M, int N,
                     int K, const std::vector<float>& ones) {
  if (dX)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(M), K, N, 1.0f, dY, N, W, K, 0.0f, dX, K);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, static_cast<int>(M), 1.0f, dY, N, X, K, 0.0f, dW, K);
  cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(M), N, 1.0f, dY, N, ones.data(), 1, 0.0f, db, 1);
}

void layernorm(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, long rows, int n) {
  parallel_for((rows + 63) / 64, 1, [&](long c) {
    detail::layernorm_rows(x, w, b, y, mean, rstd, c * 64, std::min(rows, c * 64 + 64), n);
  });
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

// y += x over [rows, n], split over the cores.
void add_rows(float* y, const float* x, long rows, int n) {
  parallel_for((rows + 63) / 64, 1, [&](long c) {
    const long r0 = c * 64, r1 = std::min(rows, r0 + 64);
    detail::add_into(y + r0 * n, x + r0 * n, (r1 - r0) * n);
  });
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
// is OpenBLAS) and OpenBLAS starts new ones, inheriting the flags, on its next call.
extern "C" void blas_thread_shutdown_(void) __attribute__((weak));

class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFtz | kDaz);
    static std::once_flag restart;
    std::call_once(restart, [] {
      if (blas_thread_shutdown_) blas_thread_shutdown_();
    });
  }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

}  // namespace

// Sizes the model's host buffers, or only counts them (activation_bytes): one list of
// buffers serves both, as the cuda model's Arena does, so the count cannot drift.
struct HostBuffers {
  bool count_only = false;
  uint64_t floats = 0;
  void take(std::vector<float>& v, uint64_t n) {
    floats += n;
    if (!count_only) v.resize(n);
  }
};

// Activations one block keeps from forward for backward (all [rows = B*T] x width).
struct BlockActs {
  std::vector<float> ln1, mean1, rstd1;  // [BT, d], [BT], [BT]
  std::vector<float> qkv;                // [BT, 3d]
  std::vector<float> att, lse;           // [BT, d], [B, H, T]
  std::vector<float> x2;                 // [BT, d]  residual after attention
  std::vector<float> ln2, mean2, rstd2;  // [BT, d], [BT], [BT]
  std::vector<float> fc, gel;            // [BT, 4d] before and after GELU
  void carve(HostBuffers& a, long bt, int d, int heads) {
    a.take(ln1, bt * d); a.take(mean1, bt); a.take(rstd1, bt);
    a.take(qkv, bt * 3 * d);
    a.take(att, bt * d); a.take(lse, static_cast<uint64_t>(bt) * heads);
    a.take(x2, bt * d);
    a.take(ln2, bt * d); a.take(mean2, bt); a.take(rstd2, bt);
    a.take(fc, bt * 4 * d); a.take(gel, bt * 4 * d);
  }
};

struct Gpt::Impl {
  GptShape s;
  GptOptions o;
  GptBlockLayout lay;
  long bt_max;
  std::vector<std::vector<float>> resid;  // [L+1][BT, d]: block inputs, then the final residual
  std::vector<BlockActs> acts;            // L (no checkpointing) or 1 (recompute scratch)
  std::vector<float> lnf, meanf, rstdf;   // [BT, d], [BT], [BT]
  std::vector<float> dres, dsmall, dbig, dqkv;  // gradients: [BT, d], [BT, d], [BT, 4d], [BT, 3d]
  std::vector<float> logits;              // [chunk rows, V]
  std::vector<float> ones;                // [BT] for column sums
  long chunk_rows;
  uint64_t bytes = 0;                     // every buffer above (activation_bytes)
  const int32_t* inputs = nullptr;        // the caller's host arrays, this micro-batch
  const int32_t* targets = nullptr;

  struct CountOnly {};
  // Lays the buffers out without allocating: bytes only (activation_bytes).
  Impl(const GptShape& shape, const GptOptions& opts, CountOnly) : s(shape), o(opts), lay(gpt_block_layout(shape.d_model)) {
    validate(s);
    if (o.micro_batch < 1) throw ConfigError("micro_batch = " + std::to_string(o.micro_batch) + " must be at least 1");
    bt_max = static_cast<long>(o.micro_batch) * s.seq_len;
    chunk_rows = std::clamp<long>(static_cast<long>(kLogitsChunkBytes / (4ull * s.vocab)), 1, bt_max);
    HostBuffers count{true};
    carve(count);
    bytes = count.floats * 4;
  }

  Impl(const GptShape& shape, const GptOptions& opts) : Impl(shape, opts, CountOnly{}) {
    HostBuffers real;
    carve(real);
    std::fill(ones.begin(), ones.end(), 1.0f);
  }

  void carve(HostBuffers& a) {
    const int d = s.d_model;
    resid.resize(s.layers + 1);
    for (auto& r : resid) a.take(r, bt_max * d);
    acts.resize(o.checkpointing == ActivationCheckpointing::None ? s.layers : 1);
    for (BlockActs& b : acts) b.carve(a, bt_max, d, s.heads);
    a.take(lnf, bt_max * d); a.take(meanf, bt_max); a.take(rstdf, bt_max);
    a.take(dres, bt_max * d); a.take(dsmall, bt_max * d); a.take(dbig, bt_max * 4 * d); a.take(dqkv, bt_max * 3 * d);
    a.take(logits, static_cast<uint64_t>(chunk_rows) * s.vocab);
    a.take(ones, bt_max);
  }

  BlockActs& acts_for(int l) { return o.checkpointing == ActivationCheckpointing::None ? acts[l] : acts[0]; }

  // The driver's operations (gpt_driver.hpp).
  void load_tokens(const int32_t* in, const int32_t* tgt, long) {
    inputs = in;
    targets = tgt;
  }
  void release(WeightSource& ws, int g) { ws.release_params(g); }
  void ready(WeightSource& ws, int g) { ws.grads_ready(g); }
  void block_forward(int l, const void* wv, bool keep_output, int B, int T) {
    const auto* w = static_cast<const float*>(wv);
    block_forward(w, resid[l].data(), acts_for(l), keep_output ? resid[l + 1].data() : nullptr, B, T);
  }
  void block_backward(int l, const void* wv, void* gv, int B, int T) {
    const auto* w = static_cast<const float*>(wv);
    auto* g = static_cast<float*>(gv);
    block_backward(w, resid[l].data(), acts_for(l), g, B, T);
  }
  void last_logits(const void* wfv, const void* wtev, int len, float* out) {
    const auto* wf = static_cast<const float*>(wfv);
    const auto* wte = static_cast<const float*>(wtev);
    const int d = s.d_model;
    const float* x = resid[s.layers].data() + static_cast<long>(len - 1) * d;
    float mean, rstd;
    math::layernorm_row(x, wf, wf + d, lnf.data(), d, &mean, &rstd);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, s.vocab, d, 1.0f, wte, d, lnf.data(), 1, 0.0f, out, 1);
  }

  void embed(const void* wv, int B, int T) {
    const auto* w = static_cast<const float*>(wv);
    const int32_t* tok = inputs;
    const int d = s.d_model;
    const float* wte = w;
    const float* wpe = w + static_cast<long>(s.vocab) * d;
    float* x = resid[0].data();
    parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
      const int t = static_cast<int>(r % T);
      const float* e = wte + static_cast<long>(tok[r]) * d;
      const float* p = wpe + static_cast<long>(t) * d;
      for (int c = 0; c < d; ++c) x[r * d + c] = e[c] + p[c];
    });
  }

  // x [BT, d] -> a's activations; writes x + block(x) to out when out is not null.
  void block_forward(const float* w, const float* x, BlockActs& a, float* out, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    layernorm(x, w + lay.ln1_w, w + lay.ln1_b, a.ln1.data(), a.mean1.data(), a.rstd1.data(), bt, d);
    linear(a.ln1.data(), w + lay.qkv_w, w + lay.qkv_b, a.qkv.data(), bt, 3 * d, d);
    detail::attention_forward(a.qkv.data(), a.att.data(), a.lse.data(), B, T, d, s.heads);
    linear(a.att.data(), w + lay.attn_proj_w, w + lay.attn_proj_b, a.x2.data(), bt, d, d);
    float* x2 = a.x2.data();
    add_rows(x2, x, bt, d);
    layernorm(x2, w + lay.ln2_w, w + lay.ln2_b, a.ln2.data(), a.mean2.data(), a.rstd2.data(), bt, d);
    linear(a.ln2.data(), w + lay.fc_w, w + lay.fc_b, a.fc.data(), bt, 4 * d, d);
    const float* fc = a.fc.data();
    float* gel = a.gel.data();
    parallel_for((bt + 15) / 16, 1, [&](long c) {
      const long r0 = c * 16, r1 = std::min(bt, r0 + 16);
      detail::gelu_forward(fc + r0 * 4 * d, gel + r0 * 4 * d, (r1 - r0) * 4 * d);
    });
    if (!out) return;
    linear(gel, w + lay.mlp_proj_w, w + lay.mlp_proj_b, out, bt, d, 4 * d);
    add_rows(out, x2, bt, d);
  }

  // dres: gradient of the block's output in, of its input out. g: the block's gradient.
  void block_backward(const float* w, const float* x, BlockActs& a, float* g, int B, int T) {
    const int d = s.d_model;
    const long bt = static_cast<long>(B) * T;
    float* dr = dres.data();
    // MLP: out = x2 + gelu(fc(ln2(x2))) Wp^T + bp
    linear_backward(dr, a.gel.data(), w + lay.mlp_proj_w, dbig.data(), g + lay.mlp_proj_w, g + lay.mlp_proj_b, bt, d,
                    4 * d, ones);
    const float* fc = a.fc.data();
    float* db = dbig.data();
    parallel_for((bt + 15) / 16, 1, [&](long c) {
      const long r0 = c * 16, r1 = std::min(bt, r0 + 16);
      detail::gelu_backward(db + r0 * 4 * d, fc + r0 * 4 * d, (r1 - r0) * 4 * d);
    });
    linear_backward(db, a.ln2.data(), w + lay.fc_w, dsmall.data(), g + lay.fc_w, g + lay.fc_b, bt, 4 * d, d, ones);
    layernorm_backward(dsmall.data(), a.x2.data(), w + lay.ln2_w, a.mean2.data(), a.rstd2.data(), dr, g + lay.ln2_w,
                       g + lay.ln2_b, bt, d);
    // Attention: x2 = x + attn(ln1(x)) Wo^T + bo
    linear_backward(dr, a.att.data(), w + lay.attn_proj_w, dsmall.data(), g + lay.attn_proj_w, g + lay.attn_proj_b,
                    bt, d, d, ones);
    detail::attention_backward(a.qkv.data(), a.att.data(), a.lse.data(), dsmall.data(), dqkv.data(), B, T, d, s.heads);
    linear_backward(dqkv.data(), a.ln1.data(), w + lay.qkv_w, dsmall.data(), g + lay.qkv_w, g + lay.qkv_b, bt, 3 * d,
                    d, ones);
    layernorm_backward(dsmall.data(), x, w + lay.ln1_w, a.mean1.data(), a.rstd1.data(), dr, g + lay.ln1_w,
                       g + lay.ln1_b, bt, d);
  }

  // Final layer norm, tied head and mean cross-entropy over rows [0, bt). With dwte, also
  // backward: dwte (overwritten) gets the head's gradient and dres the final residual's.
  double head(const void* wfv, const void* wtev, long bt, void* dwtev, void* dlnfv, float loss_scale) {
    const auto* wf = static_cast<const float*>(wfv);
    const auto* wte = static_cast<const float*>(wtev);
    auto* dwte = static_cast<float*>(dwtev);
    auto* dlnf_wb = static_cast<float*>(dlnfv);
    const int d = s.d_model, V = s.vocab;
    const float* xf = resid[s.layers].data();
    layernorm(xf, wf, wf + d, lnf.data(), meanf.data(), rstdf.data(), bt, d);
    double loss = 0;
    const float inv_n = loss_scale / static_cast<float>(bt);  // the gradient's scale
    float* dl = dsmall.data();  // gradient of lnf's output
    for (long r0 = 0; r0 < bt; r0 += chunk_rows) {
      const long nr = std::min(chunk_rows, bt - r0);
      float* lg = logits.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nr), V, d, 1.0f, lnf.data() + r0 * d, d,
                  wte, d, 0.0f, lg, V);
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
        }
      });
      for (double v : row_loss) loss += v;
      if (!dwte) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(nr), d, V, 1.0f, lg, V, wte, d, 0.0f,
                  dl + r0 * d, d);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, d, static_cast<int>(nr), 1.0f, lg, V,
                  lnf.data() + r0 * d, d, r0 == 0 ? 0.0f : 1.0f, dwte, d);
    }
    if (dwte) {
      std::fill(dres.begin(), dres.begin() + bt * d, 0.0f);
      layernorm_backward(dl, xf, wf, meanf.data(), rstdf.data(), dres.data(), dlnf_wb, dlnf_wb + d, bt, d);
    }
    return loss / static_cast<double>(bt);
  }

  // Adds the embedding gradient into g0 (wte part holds the head's; wpe part is written).
  void embed_backward(void* g0v, int B, int T) {
    auto* g0 = static_cast<float*>(g0v);
    const int32_t* tok = inputs;
    const int d = s.d_model;
    float* dwte = g0;
    float* dwpe = g0 + static_cast<long>(s.vocab) * d;
    std::fill(dwpe, dwpe + static_cast<long>(s.seq_len) * d, 0.0f);
    const float* dr = dres.data();
    // Rows with the same token add into one wte row: each thread owns a range of channels.
    constexpr int kCols = 64;
    parallel_for((d + kCols - 1) / kCols, 1, [&](long cb) {
      const int c0 = static_cast<int>(cb) * kCols, c1 = std::min(d, c0 + kCols);
      for (long r = 0; r < static_cast<long>(B) * T; ++r) {
        const float* v = dr + r * d;
        float* e = dwte + static_cast<long>(tok[r]) * d;
        float* p = dwpe + (r % T) * d;
        for (int c = c0; c < c1; ++c) {
          e[c] += v[c];
          p[c] += v[c];
        }
      }
    });
  }
};

Gpt::Gpt(const GptShape& shape, const GptOptions& opts)
    : GptModel(shape, opts), impl_(std::make_unique<Impl>(shape, opts)) {}
Gpt::~Gpt() = default;

double Gpt::forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets, float loss_scale) {
  const FlushDenormals ftz;
  return detail::gpt_forward_backward(*impl_, ws, shape_, opts_, inputs, targets, loss_scale);
}

double Gpt::forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) {
  const FlushDenormals ftz;
  return detail::gpt_forward_loss(*impl_, ws, shape_, opts_, inputs, targets);
}

void Gpt::next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* out) {
  const FlushDenormals ftz;
  detail::gpt_next_token_logits(*impl_, ws, shape_, opts_, tokens, len, out);
}

uint64_t Gpt::activation_bytes(const GptShape& s, const GptOptions& o) {
  return Impl(s, o, Impl::CountOnly{}).bytes;
}

uint64_t Gpt::activation_bytes() const { return impl_->bytes; }

// ---------------------------------------------------------------------------------------

HostWeights::HostWeights(std::vector<std::vector<float>> groups, DType dtype) : dtype_(dtype) {
  if (!is_working_dtype(dtype)) throw Error(std::string("HostWeights: ") + to_string(dtype) + " is not f32, bf16 or fp16");
  const size_t es = dtype_size(dtype);
  for (auto& g : groups) {
    numel_.push_back(g.size());
    params_.emplace_back(g.size() * es);
    convert_from_f32(params_.back().data(), dtype, g.data(), g.size());
    std::vector<float>().swap(g);
  }
  grads_.resize(numel_.size());
  held_.assign(numel_.size(), 0);
}

const void* HostWeights::acquire_params(int g) {
  ++held_.at(g);
  return params_.at(g).data();
}

void HostWeights::release_params(int g) {
  if (held_.at(g) <= 0) throw Error("release_params: group " + std::to_string(g) + " is not acquired");
  --held_[g];
}

void* HostWeights::gradient_buffer(int g) {
  // NaN in every element, whatever the type: the model must overwrite each one.
  grads_.at(g).assign(numel_.at(g) * dtype_size(dtype_), std::byte{0xff});
  return grads_[g].data();
}

std::vector<float> HostWeights::grads(int g) const {
  std::vector<float> out(grads_.at(g).size() / dtype_size(dtype_));
  convert_to_f32(out.data(), grads_[g].data(), dtype_, out.size());
  return out;
}

void HostWeights::grads_ready(int) {}

double measure_cpu_matmul_peak(double seconds) {
  const int n = 1024;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / dt);
  } while (std::chrono::steady_clock::now() < until);
  return best;
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

}  // namespace strata
