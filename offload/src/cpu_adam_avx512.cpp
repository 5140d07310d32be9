// The AVX-512 kernel of CpuAdam. Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// and -ffp-contract=off (offload/CMakeLists.txt); only called after the run-time check
// in cpu_adam.cpp. Same operations, in the same order, as math::adam_update.
#if defined(__x86_64__)

// GCC 12's AVX-512 headers initialise undefined vectors from themselves (`__Y = __Y`),
// which -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "cpu_adam_kernels.hpp"

namespace strata::detail {

namespace {

struct Scalars512 {
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_decay, param_decay, grad_scale;
  Scalars512(const math::AdamStepScalars& s, float scale)
      : beta1(_mm512_set1_ps(s.beta1)),
        one_minus_beta1(_mm512_set1_ps(s.one_minus_beta1)),
        beta2(_mm512_set1_ps(s.beta2)),
        one_minus_beta2(_mm512_set1_ps(s.one_minus_beta2)),
        neg_step_size(_mm512_set1_ps(s.neg_step_size)),
        bias_correction2_sqrt(_mm512_set1_ps(s.bias_correction2_sqrt)),
        eps(_mm512_set1_ps(s.eps)),
        grad_decay(_mm512_set1_ps(s.grad_decay)),
        param_decay(_mm512_set1_ps(s.param_decay)),
        grad_scale(_mm512_set1_ps(scale)) {}
};

// Gradient elements [i, i + 16) widened to fp32, exactly as bf16_to_float and
// fp16_to_float do. bf16 is a shift (AVX512-BF16 has no widening conversion, and is not
// needed for one); VCVTPH2PS converts every fp16, subnormals included, exactly.
template <DType G>
inline __m512 load_grad16(const void* grads, size_t i) {
  if constexpr (G == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grads) + i));
    if constexpr (G == DType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

// float_to_bf16 on 16 lanes.
inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// Elements [i, i + 16).
template <math::HalfKind Kind, DType G>
inline void update16(const Scalars512& s, const AdamArrays& a, uint16_t* half, size_t i) {
  __m512 p = _mm512_loadu_ps(a.params_in + i);
  __m512 g = _mm512_mul_ps(load_grad16<G>(a.grads, i), s.grad_scale);
  __m512 m = _mm512_loadu_ps(a.exp_avg_in + i);
  __m512 v = _mm512_loadu_ps(a.exp_avg_sq_in + i);
  p = _mm512_mul_ps(p, s.param_decay);
  g = _mm512_fmadd_ps(p, s.grad_decay, g);
  m = _mm512_fmadd_ps(g, s.one_minus_beta1, _mm512_mul_ps(m, s.beta1));
  v = _mm512_fmadd_ps(_mm512_mul_ps(s.one_minus_beta2, g), g, _mm512_mul_ps(v, s.beta2));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), s.bias_correction2_sqrt), s.eps);
  p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(s.neg_step_size, m), denom));
  _mm512_storeu_ps(a.params_out + i, p);
  _mm512_storeu_ps(a.exp_avg_out + i, m);
  _mm512_storeu_ps(a.exp_avg_sq_out + i, v);
  // The copy is written and never read here: streaming stores skip reading its lines in
  // first (run() aligns half + i to 32 bytes).
  if constexpr (Kind == math::HalfKind::Bf16) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(half + i), to_bf16(p));
  } else if constexpr (Kind == math::HalfKind::Fp16) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(half + i),
                        _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <math::HalfKind Kind, DType G>
void run(const math::AdamStepScalars& scalars, const AdamArrays& a, size_t n, bool prefetch) {
  const Scalars512 s(scalars, a.grad_scale);
  uint16_t* half = static_cast<uint16_t*>(a.half_out);
  const auto* grads = static_cast<const GradElement<G>*>(a.grads);
  const size_t head = half_copy_head(half, 32, n);  // scalar elements before half + i is 32-byte aligned
  adam_scalar_range<Kind, G>(scalars, a, 0, head);
  size_t i = head;
  for (; prefetch && i + kPrefetchAhead + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(a.params_in + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(grads + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a.exp_avg_in + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a.exp_avg_sq_in + i + kPrefetchAhead), _MM_HINT_T0);
    update16<Kind, G>(s, a, half, i);
  }
  for (; i + 16 <= n; i += 16) update16<Kind, G>(s, a, half, i);
  if constexpr (Kind != math::HalfKind::None) _mm_sfence();  // the streamed copy before the tail and the return
  adam_scalar_range<Kind, G>(scalars, a, i, n);
}

}  // namespace

void adam_kernel_avx512(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool prefetch) {
  dispatch_adam(a, [&](auto kind, auto grad) { run<kind.value, grad.value>(s, a, n, prefetch); });
}

}  // namespace strata::detail

#endif  // __x86_64__
