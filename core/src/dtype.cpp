#include "strata/core/dtype.hpp"

namespace strata {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F32: return 4;
    case DType::F64: return 8;
  }
  return 0;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::U8: return "uint8";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F16: return "half";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float";
    case DType::F64: return "double";
  }
  return "?";
}

}  // namespace strata
