// Block-wise symmetric int8 quantization (ZeRO++ qwZ's weight format): n values in blocks
// of `block`, each block's largest magnitude mapped to 127 with one fp32 scale, values
// rounded to nearest. The buffer holds the n int8 values, then one fp32 scale per block
// (the last block may be partial): quantized_bytes(n, block) bytes (shard_layout.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/dtype.hpp"

namespace strata::math {

// What quantizing cost: the squared L2 norms of the rounding error and of the values.
struct QuantizeError {
  double error_sq = 0, value_sq = 0;
  double relative() const;  // sqrt(error_sq / value_sq); 0 for all-zero values
};

// What a non-finite value does: Refuse throws std::invalid_argument (weights: a block's
// scale cannot hold it); Propagate gives its block a NaN scale, so every value of the
// block dequantizes to NaN and the receiver's finite check sees it (gradients: an fp16
// overflow skips the step as it does unquantized). Propagated blocks are left out of the
// error.
enum class NonFinite { Refuse, Propagate };

// Quantizes n values of type t (F32, BF16 or F16) from src into out; returns the error
// the receiver will see (dequantize(out) against src).
QuantizeError quantize_int8(const void* src, DType t, size_t n, size_t block, uint8_t* out,
                            NonFinite non_finite = NonFinite::Refuse);
// The inverse: n values of type t into dst.
void dequantize_int8(const uint8_t* in, size_t n, size_t block, void* dst, DType t);
// acc[i] += the i-th dequantized value, for i < n (ZeRO++ qgZ's reduction in fp32).
void dequantize_add_int8(const uint8_t* in, size_t n, size_t block, float* acc);

}  // namespace strata::math
