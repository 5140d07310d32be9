// Whole-array conversions between fp32 and the 16-bit float types (bf16, IEEE fp16), on
// host memory, round to nearest even (core/math/half.hpp gives the per-element bits,
// which these match exactly). Vectorised for the running CPU (GCC target_clones): the
// model converts activations before every 16-bit matmul and the engine converts
// gradients and working copies, so these run at memory speed.
#pragma once

#include <cstddef>
#include <string_view>

#include "strata/core/dtype.hpp"

namespace strata {

// True for the floating-point types a model may train in: F32, BF16, F16.
bool is_working_dtype(DType t);
// "f32", "bf16", "fp16": the names configuration, CLI flags and checkpoints use.
const char* precision_name(DType t);
// Parses "f32"/"fp32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; throws
// ConfigError naming the choices.
DType parse_precision(const std::string_view name);

// dst[i] = float(src[i]) for src of type t (F32 copies).
void convert_to_f32(float* dst, const void* src, DType t, size_t n);
// dst[i] = t(src[i]), rounded to nearest even (F32 copies).
void convert_from_f32(void* dst, DType t, const float* src, size_t n);
// dst[i] += float(src[i]).
void accumulate_f32(float* dst, const void* src, DType t, size_t n);
// Sum of float(src[i])^2 in double (inf or NaN when an element is).
double sum_squares_of(const void* src, DType t, size_t n);
// Converts between any two of F32, BF16, F16 (equal types copy).
void convert_any(void* dst, DType dst_t, const void* src, DType src_t, size_t n);

}  // namespace strata
