#include "strata/collectives/dtype.hpp"

namespace strata::coll {

size_t size_of(DataType t) {
  switch (t) {
    case DataType::U8: return 1;
    case DataType::I32: return 4;
    case DataType::I64: return 8;
    case DataType::F16: return 2;
    case DataType::BF16: return 2;
    case DataType::F32: return 4;
    case DataType::F64: return 8;
  }
  return 0;
}

const char* to_string(DataType t) {
  switch (t) {
    case DataType::U8: return "uint8";
    case DataType::I32: return "int32";
    case DataType::I64: return "int64";
    case DataType::F16: return "half";
    case DataType::BF16: return "bfloat16";
    case DataType::F32: return "float";
    case DataType::F64: return "double";
  }
  return "?";
}

}  // namespace strata::coll
