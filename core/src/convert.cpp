#include "strata/core/convert.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/math/half.hpp"

#include "strata/core/target_clones.hpp"

namespace strata {

namespace {

STRATA_CLONES void bf16_to_f32(float* dst, const uint16_t* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dst[i] = math::bf16_to_float(src[i]);
}
STRATA_CLONES void f32_to_bf16(uint16_t* dst, const float* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dst[i] = math::float_to_bf16(src[i]);
}
STRATA_CLONES void fp16_to_f32(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = math::fp16_to_float(src[i]);
}
STRATA_CLONES void f32_to_fp16(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = math::float_to_fp16(src[i]);
}
STRATA_CLONES void add_f32(float* dst, const float* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}
STRATA_CLONES void add_bf16(float* dst, const uint16_t* src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dst[i] += math::bf16_to_float(src[i]);
}
STRATA_CLONES void add_fp16(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += math::fp16_to_float(src[i]);
}
// Summed in double: the norm decides whether a step is skipped, and a float partial
// could overflow where the true sum does not.
STRATA_CLONES double sumsq_f32(const float* src, size_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(src[i]) * src[i];
  return acc;
}
STRATA_CLONES double sumsq_bf16(const uint16_t* src, size_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (size_t i = 0; i < n; ++i) {
    const double v = math::bf16_to_float(src[i]);
    acc += v * v;
  }
  return acc;
}
double sumsq_fp16(const uint16_t* src, size_t n) {
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = math::fp16_to_float(src[i]);
    acc += v * v;
  }
  return acc;
}

[[noreturn]] void not_float(DType t, const char* what) {
  throw Error(std::string(what) + ": element type " + to_string(t) + " is not f32, bf16 or fp16");
}

}  // namespace

bool is_working_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

const char* precision_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    default: return to_string(t);
  }
}

DType parse_precision(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::F16;
  throw ConfigError("unknown precision '" + std::string(name) + "': choose f32, bf16 or fp16");
}

void convert_to_f32(float* dst, const void* src, DType t, size_t n) {
  if (n == 0) return;  // an empty vector's data() may be null, which memmove may not take
  switch (t) {
    case DType::F32: std::memmove(dst, src, n * 4); return;
    case DType::BF16: bf16_to_f32(dst, static_cast<const uint16_t*>(src), n); return;
    case DType::F16: fp16_to_f32(dst, static_cast<const uint16_t*>(src), n); return;
    default: not_float(t, "convert_to_f32");
  }
}

void convert_from_f32(void* dst, DType t, const float* src, size_t n) {
  switch (t) {
    case DType::F32: std::memmove(dst, src, n * 4); return;
    case DType::BF16: f32_to_bf16(static_cast<uint16_t*>(dst), src, n); return;
    case DType::F16: f32_to_fp16(static_cast<uint16_t*>(dst), src, n); return;
    default: not_float(t, "convert_from_f32");
  }
}

void accumulate_f32(float* dst, const void* src, DType t, size_t n) {
  switch (t) {
    case DType::F32: add_f32(dst, static_cast<const float*>(src), n); return;
    case DType::BF16: add_bf16(dst, static_cast<const uint16_t*>(src), n); return;
    case DType::F16: add_fp16(dst, static_cast<const uint16_t*>(src), n); return;
    default: not_float(t, "accumulate_f32");
  }
}

double sum_squares_of(const void* src, DType t, size_t n) {
  switch (t) {
    case DType::F32: return sumsq_f32(static_cast<const float*>(src), n);
    case DType::BF16: return sumsq_bf16(static_cast<const uint16_t*>(src), n);
    case DType::F16: return sumsq_fp16(static_cast<const uint16_t*>(src), n);
    default: not_float(t, "sum_squares_of");
  }
}

void convert_any(void* dst, DType dst_t, const void* src, DType src_t, size_t n) {
  if (dst_t == src_t) {
    if (!is_working_dtype(dst_t)) not_float(dst_t, "convert_any");
    std::memmove(dst, src, n * dtype_size(dst_t));
    return;
  }
  if (src_t == DType::F32) return convert_from_f32(dst, dst_t, static_cast<const float*>(src), n);
  if (dst_t == DType::F32) return convert_to_f32(static_cast<float*>(dst), src, src_t, n);
  // 16-bit to the other 16-bit type: through fp32 in blocks.
  float tmp[4096];
  for (size_t i = 0; i < n; i += 4096) {
    const size_t k = std::min<size_t>(4096, n - i);
    convert_to_f32(tmp, static_cast<const char*>(src) + i * 2, src_t, k);
    convert_from_f32(static_cast<char*>(dst) + i * 2, dst_t, tmp, k);
  }
}

}  // namespace strata
