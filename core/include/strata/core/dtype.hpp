// Element types of tensors and collective buffers: one enum for the whole runtime.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

enum class DType : uint8_t {
  U8,    // uint8_t, std::byte
  I32,   // int32_t
  I64,   // int64_t
  F16,   // IEEE binary16
  BF16,  // bfloat16
  F32,   // float
  F64,   // double
};

size_t dtype_size(DType t);        // bytes per element
const char* to_string(DType t);    // "float", "bfloat16", ...

}  // namespace strata
