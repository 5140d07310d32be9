// The AVX2 kernel of CpuAdam. Built with -mavx2 -mfma -mf16c and -ffp-contract=off
// (offload/CMakeLists.txt); only called after the run-time check in cpu_adam.cpp. Same
// operations, in the same order, as math::adam_update.
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu_adam_kernels.hpp"

namespace strata::detail {

namespace {

struct Scalars256 {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_decay, param_decay, grad_scale;
  Scalars256(const math::AdamStepScalars& s, float scale)
      : beta1(_mm256_set1_ps(s.beta1)),
        one_minus_beta1(_mm256_set1_ps(s.one_minus_beta1)),
        beta2(_mm256_set1_ps(s.beta2)),
        one_minus_beta2(_mm256_set1_ps(s.one_minus_beta2)),
        neg_step_size(_mm256_set1_ps(s.neg_step_size)),
        bias_correction2_sqrt(_mm256_set1_ps(s.bias_correction2_sqrt)),
        eps(_mm256_set1_ps(s.eps)),
        grad_decay(_mm256_set1_ps(s.grad_decay)),
        param_decay(_mm256_set1_ps(s.param_decay)),
        grad_scale(_mm256_set1_ps(scale)) {}
};

// Gradient elements [i, i + 8) widened to fp32, exactly as bf16_to_float and
// fp16_to_float do (VCVTPH2PS converts every fp16, subnormals included, exactly).
template <DType G>
inline __m256 load_grad8(const void* grads, size_t i) {
  if constexpr (G == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grads) + i));
    if constexpr (G == DType::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

// float_to_bf16 on 8 lanes.
inline __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  // packus works within 128-bit lanes: [r0..3 r0..3 | r4..7 r4..7]; gather qwords 0 and 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

// Elements [i, i + 8).
template <math::HalfKind Kind, DType G>
inline void update8(const Scalars256& s, const AdamArrays& a, uint16_t* half, size_t i) {
  __m256 p = _mm256_loadu_ps(a.params_in + i);
  __m256 g = _mm256_mul_ps(load_grad8<G>(a.grads, i), s.grad_scale);
  __m256 m = _mm256_loadu_ps(a.exp_avg_in + i);
  __m256 v = _mm256_loadu_ps(a.exp_avg_sq_in + i);
  p = _mm256_mul_ps(p, s.param_decay);
  g = _mm256_fmadd_ps(p, s.grad_decay, g);
  m = _mm256_fmadd_ps(g, s.one_minus_beta1, _mm256_mul_ps(m, s.beta1));
  v = _mm256_fmadd_ps(_mm256_mul_ps(s.one_minus_beta2, g), g, _mm256_mul_ps(v, s.beta2));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), s.bias_correction2_sqrt), s.eps);
  p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(s.neg_step_size, m), denom));
  _mm256_storeu_ps(a.params_out + i, p);
  _mm256_storeu_ps(a.exp_avg_out + i, m);
  _mm256_storeu_ps(a.exp_avg_sq_out + i, v);
  // The copy is written and never read here: streaming stores skip reading its lines in
  // first (run() aligns half + i to 16 bytes).
  if constexpr (Kind == math::HalfKind::Bf16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(half + i), to_bf16(p));
  } else if constexpr (Kind == math::HalfKind::Fp16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(half + i),
                     _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <math::HalfKind Kind, DType G>
void run(const math::AdamStepScalars& scalars, const AdamArrays& a, size_t n, bool prefetch) {
  const Scalars256 s(scalars, a.grad_scale);
  uint16_t* half = static_cast<uint16_t*>(a.half_out);
  const auto* grads = static_cast<const GradElement<G>*>(a.grads);
  const size_t head = half_copy_head(half, 16, n);  // scalar elements before half + i is 16-byte aligned
  adam_scalar_range<Kind, G>(scalars, a, 0, head);
  size_t i = head;
  for (; prefetch && i + kPrefetchAhead + 16 <= n; i += 16) {  // one cache line of each fp32 array
    _mm_prefetch(reinterpret_cast<const char*>(a.params_in + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(grads + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a.exp_avg_in + i + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a.exp_avg_sq_in + i + kPrefetchAhead), _MM_HINT_T0);
    update8<Kind, G>(s, a, half, i);
    update8<Kind, G>(s, a, half, i + 8);
  }
  for (; i + 8 <= n; i += 8) update8<Kind, G>(s, a, half, i);
  if constexpr (Kind != math::HalfKind::None) _mm_sfence();  // the streamed copy before the tail and the return
  adam_scalar_range<Kind, G>(scalars, a, i, n);
}

}  // namespace

void adam_kernel_avx2(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool prefetch) {
  dispatch_adam(a, [&](auto kind, auto grad) { run<kind.value, grad.value>(s, a, n, prefetch); });
}

}  // namespace strata::detail

#endif  // __x86_64__
