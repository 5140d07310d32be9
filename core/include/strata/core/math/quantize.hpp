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

// Quantizes n values of type t (F32, BF16 or F16) from src into out; returns the error
// the receiver will see (dequantize(out) against src). Non-finite values are refused
// (std::invalid_argument): a block's scale cannot hold them.
QuantizeError quantize_int8(const void* src, DType t, size_t n, size_t block, uint8_t* out);
// The inverse: n values of type t into dst.
void dequantize_int8(const uint8_t* in, size_t n, size_t block, void* dst, DType t);

}  // namespace strata::math
