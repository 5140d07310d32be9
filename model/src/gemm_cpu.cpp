#include "gemm_cpu.hpp"

#include <omp.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/config_keys.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata::detail {
namespace {

const char* dnnl_status_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_runtime_error: return "runtime error";
    default: return "oneDNN error";
  }
}

}  // namespace
}  // namespace strata::detail

STRATA_DEFINE_CALL_CHECK(check_dnnl_call, "oneDNN", dnnl_status_t, code == dnnl_success, dnnl_status_name(code))
#define STRATA_CHECK_DNNL(expr) ::strata::detail::check_dnnl_call((expr), #expr, __FILE__, __LINE__)

namespace strata::detail {
namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32: return memory::data_type::f32;
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: STRATA_CHECK(false, std::string("no matmul over ") + to_string(t));
  }
  return memory::data_type::undef;
}

// The memory descriptors of C = op(A) op(B) (+ bias): op(A) is [M, K], op(B) [K, N]; a
// transposed operand is the stored matrix read with swapped strides.
struct Descs {
  memory::desc a, b, bias, c;
};

Descs descs(long M, long N, long K, const MatRef& a, const MatRef& b, bool bias, DType c_type, long ldc) {
  return {memory::desc({M, K}, dnnl_type(a.type), a.trans ? memory::dims{1, a.ld} : memory::dims{a.ld, 1}),
          memory::desc({K, N}, dnnl_type(b.type), b.trans ? memory::dims{1, b.ld} : memory::dims{b.ld, 1}),
          bias ? memory::desc({1, N}, memory::data_type::f32, memory::dims{N, 1}) : memory::desc(),
          memory::desc({M, N}, dnnl_type(c_type), memory::dims{ldc, 1})};
}

// oneDNN's optimised matmul for this call, or none: oneDNN cannot make one (fp16 without
// AVX512-FP16), or only its reference one (scalar loops, far slower than converting).
std::optional<dnnl::matmul::primitive_desc> describe(const dnnl::engine& eng, const Descs& d, GemmOutput out,
                                                     std::string* why) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // CpuGemm's, shared by its primitives
  if (out == GemmOutput::Accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  try {
    const auto desc = d.bias.is_zero() ? dnnl::matmul::desc(d.a, d.b, d.c) : dnnl::matmul::desc(d.a, d.b, d.bias, d.c);
    dnnl::matmul::primitive_desc pd(desc, attr, eng);
    const std::string_view impl = pd.impl_info_str();
    if (!impl.starts_with("ref")) return pd;
    *why = "oneDNN has only its reference implementation (" + std::string(impl) + ")";
  } catch (const dnnl::error& e) {
    *why = std::string("oneDNN cannot make the matmul (") + e.what() + ")";
  }
  return std::nullopt;
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "older than avx2";
  }
}

}  // namespace

std::string gemm16_native_impl(DType t, std::string* why) {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (t == DType::BF16 && !cpu_has_bf16_dot()) {
    *why = std::string("this CPU (oneDNN isa ") + isa_name(isa) + ") has no bf16 dot-product instructions";
    return {};
  }
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const MatRef a{nullptr, t, 64}, b{nullptr, t, 64, true};
  const auto pd = describe(eng, descs(64, 64, 64, a, b, true, t, 64), GemmOutput::Overwrite, why);
  if (!pd) return {};
  return std::string(pd->impl_info_str()) + " (isa " + isa_name(isa) + ")";
}

namespace {

// Floats the converting path takes for a call: each 16-bit operand, and a 16-bit C, as fp32.
uint64_t converting_floats(long M, long N, long K, DType a, DType b, DType c) {
  auto floats = [](DType t, long rows, long cols) { return t == DType::F32 ? 0 : static_cast<uint64_t>(rows) * cols; };
  return floats(a, M, K) + floats(b, K, N) + floats(c, M, N);
}

// A product of type t at one shape (C = A B^T, fp32 C, as a linear layer's), each call
// timed on the path asked for (native: oneDNN's 16-bit matmul; else sgemm, converting a
// 16-bit A and B): the peak's measurement.
class PathTimer {
 public:
  PathTimer(DType t, long M, long N, long K)
      : t_(t), M_(M), N_(N), K_(K), a_(M * K * dtype_size(t)), b_(N * K * dtype_size(t)), c_(M * N),
        workspace_(converting_floats(M, N, K, t, t, DType::F32)) {
    std::vector<float> half(std::max(M * K, N * K), 0.5f);
    convert_from_f32(a_.data(), t, half.data(), M * K);
    convert_from_f32(b_.data(), t, half.data(), N * K);
    gemm_.set_workspace(workspace_.data(), workspace_.size());
  }
  double seconds(bool native) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm_.run_on(native, M_, N_, K_, {a_.data(), t_, K_}, {b_.data(), t_, K_, true}, nullptr, c_.data(), DType::F32,
                 N_, GemmOutput::Overwrite);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double flops(double seconds) const { return 2.0 * M_ * N_ * static_cast<double>(K_) / seconds; }

 private:
  DType t_;
  long M_, N_, K_;
  std::vector<std::byte> a_, b_;
  std::vector<float> c_, workspace_;
  CpuGemm gemm_;
};

// Intel cores without AMX, where oneDNN's bf16 matmul runs on vdpbf16ps: it issues at
// half the rate of the fp32 FMAs there, so it gives no more FLOPs than sgemm.
bool intel_bf16_without_amx() {
#if defined(__x86_64__)
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return __builtin_cpu_is("intel") && cpu_has_bf16_dot() &&
         (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & amx) != amx;
#else
  return false;
#endif
}

Gemm16Choice decide_gemm16(DType t) {
  const std::string var = gemm16_env_var(t);
  std::string why;
  const std::string impl = gemm16_native_impl(t, &why);
  Gemm16Choice c = choose_gemm16(t, std::getenv(var.c_str()), impl, why, t == DType::BF16 && intel_bf16_without_amx());
  const std::string line = std::string("cpu matmuls in ") + precision_name(t) + ": " + c.path + ": " + c.why;
  if (impl.empty())
    log::warn(line);
  else
    log::info(line);
  return c;
}

template <class Fn>
void rows_parallel(long rows, Fn&& fn) {
  parallel_for((rows + 63) / 64, 1, [&](long c) { fn(c * 64, std::min(rows, c * 64 + 64)); });
}

}  // namespace

bool cpu_has_bf16_dot() {
  // The ISA values are bit sets, each containing the ones it extends.
  static const bool has = [] {
    const auto bf16_isa = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & bf16_isa) == bf16_isa;
  }();
  return has;
}

std::string gemm16_env_var(DType t) { return t == DType::F16 ? "STRATA_CPU_GEMM_FP16" : "STRATA_CPU_GEMM_BF16"; }

Gemm16Choice choose_gemm16(DType t, const char* env, const std::string& native_impl, const std::string& unavailable,
                           bool intel_bf16_without_amx) {
  const std::string type = precision_name(t), var = gemm16_env_var(t);
  const std::string v = ascii_lower(env ? env : "");
  const std::string converting = "fp32 sgemm over converted operands";
  if (!v.empty() && v != "auto" && v != "onednn" && v != "sgemm")
    throw ConfigError(var + " is '" + std::string(env) + "': set it to auto (the default), onednn or sgemm, or unset it");
  if (native_impl.empty()) {
    if (v == "onednn")
      throw ConfigError(var + "=onednn, but oneDNN has no optimised " + type + " matmul on this CPU (" + unavailable +
                        "): set it to auto or sgemm, or unset it");
    return {false, converting, unavailable + "; the same products and fp32 sums, slower"};
  }
  const std::string onednn = "oneDNN " + native_impl;
  if (v == "onednn") return {true, onednn, var + "=onednn"};
  if (v == "sgemm") return {false, converting, var + "=sgemm"};
  if (intel_bf16_without_amx)
    return {false, converting,
            "an Intel CPU without AMX, whose vdpbf16ps gives no more FLOPs than its fp32 FMAs (measured on one: "
            "oneDNN's bf16 matmul 168-172 GFLOP/s, this path 317); " +
                var + "=onednn forces oneDNN's"};
  return {true, onednn, "oneDNN has an optimised matmul; " + var + "=sgemm forces converting"};
}

const Gemm16Choice& gemm16_choice(DType t) {
  STRATA_CHECK(t == DType::BF16 || t == DType::F16, std::string("no 16-bit matmul choice for ") + to_string(t));
  if (t == DType::BF16) {
    static const Gemm16Choice bf16 = decide_gemm16(DType::BF16);
    return bf16;
  }
  static const Gemm16Choice fp16 = decide_gemm16(DType::F16);
  return fp16;
}

bool gemm_native(DType t) {
  if (t == DType::F32) return true;
  if (t == DType::BF16 || t == DType::F16) return gemm16_choice(t).native;
  return false;
}

uint64_t gemm_workspace_floats(long M, long N, long K, DType a, DType b, DType c) {
  if (a == b && gemm_native(a)) return 0;
  return converting_floats(M, N, K, a, b, c);
}

struct CpuGemm::Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// One call shape, made once: its oneDNN matmul (none when it takes the converting path)
// and memory objects whose data pointers are set per call.
struct CpuGemm::Primitive {
  long M, N, K, lda, ldb, ldc;
  bool ta, tb, bias;
  DType a_type, b_type, c_type;
  GemmOutput out;
  std::optional<dnnl::matmul> matmul;
  memory a, b, bias_mem, c, scratch;
  dnnl_exec_arg_t args[5];
  int nargs = 0;

  bool is(long m, long n, long k, const MatRef& x, const MatRef& y, bool has_bias, DType ct, long ldc_,
          GemmOutput o) const {
    return M == m && N == n && K == k && lda == x.ld && ldb == y.ld && ldc == ldc_ && ta == x.trans &&
           tb == y.trans && bias == has_bias && a_type == x.type && b_type == y.type && c_type == ct && out == o;
  }
};

CpuGemm::CpuGemm() = default;
CpuGemm::~CpuGemm() = default;

CpuGemm::Primitive& CpuGemm::primitive(long M, long N, long K, const MatRef& a, const MatRef& b, bool bias,
                                       DType c_type, long ldc, GemmOutput out) {
  for (auto& p : primitives_)
    if (p->is(M, N, K, a, b, bias, c_type, ldc, out)) return *p;
  if (!dnnl_) dnnl_ = std::make_unique<Dnnl>();
  auto p = std::make_unique<Primitive>(Primitive{M, N, K, a.ld, b.ld, ldc, a.trans, b.trans, bias, a.type, b.type,
                                                 c_type, out});
  const Descs d = descs(M, N, K, a, b, bias, c_type, ldc);
  std::string why;
  if (const auto pd = describe(dnnl_->engine, d, out, &why)) {
    p->matmul.emplace(*pd);
    const auto& eng = dnnl_->engine;
    // One scratchpad serves every primitive (calls do not overlap): the largest is 2.2 MiB
    // at GPT-2 small's shapes, all of them together 10.
    if (scratchpad_.size() < pd->scratchpad_desc().get_size()) scratchpad_.resize(pd->scratchpad_desc().get_size());
    p->a = memory(d.a, eng, nullptr);
    p->b = memory(d.b, eng, nullptr);
    p->c = memory(d.c, eng, nullptr);
    p->scratch = memory(pd->scratchpad_desc(), eng, nullptr);
    p->args[p->nargs++] = {DNNL_ARG_SRC, p->a.get()};
    p->args[p->nargs++] = {DNNL_ARG_WEIGHTS, p->b.get()};
    p->args[p->nargs++] = {DNNL_ARG_DST, p->c.get()};
    p->args[p->nargs++] = {DNNL_ARG_SCRATCHPAD, p->scratch.get()};
    if (bias) {
      p->bias_mem = memory(d.bias, eng, nullptr);
      p->args[p->nargs++] = {DNNL_ARG_BIAS, p->bias_mem.get()};
    }
  } else {
    log::warn_once("gemm " + why, "a cpu matmul of " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                      std::to_string(K) + ": " + why + "; converting its operands to fp32");
  }
  primitives_.push_back(std::move(p));
  return *primitives_.back();
}

void CpuGemm::run(long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias, void* c, DType c_type,
                  long ldc, GemmOutput out) {
  run_on(a.type == b.type && a.type != DType::F32 && gemm_native(a.type), M, N, K, a, b, bias, c, c_type, ldc, out);
}

void CpuGemm::run_on(bool native, long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias,
                     void* c, DType c_type, long ldc, GemmOutput out) {
  STRATA_CHECK(out == GemmOutput::Overwrite || c_type == DType::F32, "only an fp32 C can be accumulated into");
  STRATA_CHECK(!native || (a.type == b.type && a.type != DType::F32),
               "oneDNN's 16-bit matmul takes two operands of one 16-bit type");
  if (M == 0 || N == 0) return;
  if (native) {
    Primitive& p = primitive(M, N, K, a, b, bias != nullptr, c_type, ldc, out);
    if (p.matmul) {
      p.a.set_data_handle(const_cast<void*>(a.data));
      p.b.set_data_handle(const_cast<void*>(b.data));
      p.c.set_data_handle(c);
      p.scratch.set_data_handle(scratchpad_.data());
      if (bias) p.bias_mem.set_data_handle(const_cast<float*>(bias));
      // oneDNN runs on OpenMP's threads: as many as the model's own loops use.
      dnnl_status_t st;
      {
        const OpenMpTeam team(model_threads());
        st = dnnl_primitive_execute(p.matmul->get(), dnnl_->stream.get(), p.nargs, p.args);
      }
      STRATA_CHECK_DNNL(st);
      return;
    }
  }
  run_sgemm(M, N, K, a, b, bias, c, c_type, ldc, out);
}

void CpuGemm::run_sgemm(long M, long N, long K, const MatRef& a, const MatRef& b, const float* bias, void* c,
                        DType c_type, long ldc, GemmOutput out) {
  uint64_t used = 0;
  auto take = [&](uint64_t n) {
    STRATA_CHECK(used + n <= workspace_floats_, "the matmul workspace is too small: " + std::to_string(used + n) +
                                                    " floats needed, " + std::to_string(workspace_floats_) + " set");
    float* p = workspace_ + used;
    used += n;
    return p;
  };
  // A 16-bit operand as a dense fp32 copy of the matrix as stored (rows x cols).
  auto as_f32 = [&](const MatRef& m, long rows, long cols) {
    if (m.type == DType::F32) return m;
    float* dst = take(static_cast<uint64_t>(rows) * cols);
    const auto* src = static_cast<const std::byte*>(m.data);
    const size_t es = dtype_size(m.type);
    rows_parallel(rows, [&](long r0, long r1) {
      for (long r = r0; r < r1; ++r) convert_to_f32(dst + r * cols, src + r * m.ld * es, m.type, cols);
    });
    return MatRef{dst, DType::F32, cols, m.trans};
  };
  const MatRef af = as_f32(a, a.trans ? K : M, a.trans ? M : K);
  const MatRef bf = as_f32(b, b.trans ? N : K, b.trans ? K : N);
  float* cf = c_type == DType::F32 ? static_cast<float*>(c) : take(static_cast<uint64_t>(M) * N);
  const long ldcf = c_type == DType::F32 ? ldc : N;
  cpu_sgemm(af.trans, bf.trans, M, N, K, 1.0f, static_cast<const float*>(af.data), af.ld,
            static_cast<const float*>(bf.data), bf.ld, out == GemmOutput::Accumulate ? 1.0f : 0.0f, cf, ldcf);
  if (bias)
    rows_parallel(M, [&](long r0, long r1) {
      if (ldcf == N) return add_bias_rows(cf + r0 * ldcf, bias, r1 - r0, static_cast<int>(N));
      for (long r = r0; r < r1; ++r) add_bias_rows(cf + r * ldcf, bias, 1, static_cast<int>(N));  // C is a column slice
    });
  if (c_type != DType::F32) {
    auto* dst = static_cast<std::byte*>(c);
    const size_t es = dtype_size(c_type);
    rows_parallel(M, [&](long r0, long r1) {
      for (long r = r0; r < r1; ++r) convert_from_f32(dst + r * ldc * es, c_type, cf + r * ldcf, N);
    });
  }
}

void gemm_threads_flush_denormals() {
#if defined(__SSE__)
  constexpr unsigned kFtzDaz = 0x8040;
#pragma omp parallel num_threads(static_cast<int>(model_threads()))
  _mm_setcsr(_mm_getcsr() | kFtzDaz);
#endif
}

double measure_gemm_peak(DType t, double seconds) {
  PathTimer timer(t, 4096, 3072, 768);
  const bool native = t != DType::F32 && gemm_native(t);
  timer.seconds(native);  // makes the primitive, warms the caches and threads
  double best = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    best = std::max(best, timer.flops(timer.seconds(native)));
  } while (std::chrono::steady_clock::now() < until);
  return best;
}

}  // namespace strata::detail
