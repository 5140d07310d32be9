// A safetensors file's header (runtime/safetensors.hpp), as an import reads it: the input
// is the whole file. A header that parses promises that every tensor lies inside the
// file; each tensor's bytes are read here to hold it to that (ASan reports a read past
// the input).
#include <cstdint>
#include <string>

#include "fuzz_common.hpp"
#include "strata/runtime/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = strata::fuzz::bytes(data, size);
  strata::fuzz::only_strata_errors("fuzz_safetensors", [&] {
    const strata::SafetensorsHeader h = strata::parse_safetensors_header(in, size, "fuzz.safetensors");
    uint64_t sum = 0, end = h.data_start;
    for (const auto& t : h.tensors) {
      if (t.offset != end || t.bytes != t.numel * t.element_bytes) std::abort();
      for (uint64_t i = 0; i < t.bytes; ++i) sum += data[t.offset + i];
      end = t.offset + t.bytes;
    }
    if (end != size) std::abort();
    volatile uint64_t sink = sum;
    (void)sink;
  });
  return 0;
}
